# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""verlc's in-cluster runtime: what runs on the cluster, on the head node (and each node's Ray logs), inside the
job's container, next to verl. Standard library only (ray, torch, pyarrow and transformers are imported where
used: verl's images have them).

Every bundle ships it (targets/job_package.py): as the package verlc_job/ beside the job's JSON, or, in the Slurm
script, as one program for `python3 -`. Its modules, in the order of a run:

  protocol    names both sides use: stages, exit codes, event lines, the run folder, run ids
  job         the Job the build hands over, typed
  cli         the command line: job, pipeline, ray-logs, materialize
  runner      the stage table and the runner of a job's stages (and a pipeline's jobs)
  cluster     Ray: connect, wait for every node, tasks on each node, a sweep's turn
  data        data preparation, a pinned model's revision, earlier stages' models
  preflight   the preflight stage, with nodes, startup, collective and record
  services    services beside the trainer (with probes: readiness, contract probes; addresses: ports, variables,
              nodes of their own) and the tool config
  train       the trainer, its stall and lost-node watch; torchrun on every node
  raylogs     a node's Ray logs, bounded
"""
