"""The launcher interface: what every target's launcher (targets/*/launch.py) offers and what the lifecycle
(lifecycle/) asks of it, here so that neither imports the other. Its twin, the job protocol, ships with the runtime
(runtime/protocol.py, runtime/job.py): standard library only, it also runs on the cluster."""
