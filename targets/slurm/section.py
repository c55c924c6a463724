"""The slurm target's section: `cluster.slurm`, the sbatch directives and the login environment."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, Field, Strict, StringConstraints

from ...compiler.fields import Bool, Directive, Int, Model, Seconds, SlurmMem, SlurmTime, matching
from ...compiler.ir import TimeLimit

if TYPE_CHECKING:
    from ...compiler.spec import Spec

# sbatch --mail-type's events
MailType = Literal["NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
                   "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"]
MailUser = Annotated[str, Strict(), matching(r"[A-Za-z0-9._%+-]{1,64}(@[A-Za-z0-9.-]{1,190})?",
                                             "an e-mail address or a user name")]
GresName = Annotated[str, Strict(), matching(r"[A-Za-z][A-Za-z0-9_]{0,62}", "a Slurm GRES name such as npu")]
# sbatch reads #SBATCH lines itself (no shell): a constraint's &, |, [], * and () reach it as they are
_FEATURE = re.compile(r"!?[A-Za-z0-9_.:@+=/-]+(\*[0-9]+)?")


def constraint_problem(text: str) -> str | None:
    """Why Slurm's controller refuses `text` as a --constraint ("Invalid feature specification"), or None: features
    (a count after `*`) joined by one `&`, `|` or `,`, grouped by `()` or, for a matching OR, `[]`."""
    tokens = re.findall(r"[()\[\]]|[&|,]+|[^()\[\]&|,]+", text)
    closing = {"(": ")", "[": "]"}
    stack: list[str] = []
    operand = False  # whether the token before was an operand (a feature or a closed group)
    for token in tokens:
        if token in closing:
            if operand:
                return f"{text!r}: a group after a feature needs an operator (& | ,) between them"
            stack.append(closing[token])
            continue
        elif token in (")", "]"):
            if not stack or stack.pop() != token or not operand:
                return f"{text!r}: {token!r} closes no group or an empty one"
        elif token[0] in "&|,":
            if len(token) > 1:
                return f"{text!r}: {token!r}: features are joined by one &, | or , (AND, OR, AND)"
            if not operand:
                return f"{text!r}: {token!r} has no feature before it"
            operand = False
            continue
        elif operand and re.fullmatch(r"\*[0-9]+", token):
            continue  # a count after a group: [rack1|rack2]*2
        elif not _FEATURE.fullmatch(token):
            return f"{text!r}: {token!r} is not a node feature (letters, digits and _.:@+=/-, a count after *)"
        operand = True
    if stack:
        return f"{text!r}: {stack[-1]!r} is missing"
    if not tokens:
        return f"{text!r} has no feature"
    return None  # a trailing operator (h100&) is taken: Slurm 22.05's controller ignores it


def _constraint(text: str) -> str:
    problem = constraint_problem(text)
    if problem is not None:
        raise ValueError(f"{problem}: Slurm refuses it as an invalid feature specification")
    return text


Constraint = Annotated[str, Strict(), StringConstraints(min_length=1, max_length=255), AfterValidator(_constraint)]
# sbatch --hint's values (Slurm 22.05 on): sbatch refuses any other as "unrecognized --hint argument"
HINTS = ("compute_bound", "memory_bound", "multithread", "nomultithread")
SbatchOption = Annotated[str, Strict(), matching(r"[a-z][a-z0-9-]{0,40}", "an sbatch long option without its "
                                                                          "dashes, such as gres-flags")]


class Slurm(Model):
    """sbatch directives and the login environment; only the Slurm target reads them."""

    cpus_per_task: Int = Field(ge=1, description="CPUs of the one task per node; Ray gets exactly these.")
    mem: SlurmMem | None = Field(None, description="#SBATCH --mem per node, e.g. 200G (0: all of the node's).")
    time: SlurmTime | None = Field(None, description="#SBATCH --time, e.g. 2-00:00:00.")
    partition: Directive | None = Field(None, description="#SBATCH --partition.")
    account: Directive | None = Field(None, description="#SBATCH --account.")
    qos: Directive | None = Field(None, description="#SBATCH --qos.")
    nodelist: Directive | None = Field(None, description="#SBATCH --nodelist: run on exactly these nodes.")
    exclude: Directive | None = Field(None, description="#SBATCH --exclude: never these nodes.")
    exclusive: Bool = Field(False, description="#SBATCH --exclusive: the nodes are the job's alone (no other job's "
                                                "tasks beside Ray's).")
    constraint: Constraint | None = Field(None, description="#SBATCH --constraint: node features, e.g. h100&ib.")
    reservation: Directive | None = Field(None, description="#SBATCH --reservation: run in this reservation.")
    typed_gpus: Bool = Field(True, description="With cluster.gpu_type: ask for the GPUs by type "
                                               "(#SBATCH --gpus-per-node=H100:8); false: by count alone "
                                               "(--gpus-per-node=8), for sites whose gres.conf names no types.")
    sbatch: dict[SbatchOption, Literal[True] | Int | Directive] = Field(
        {}, description="Other #SBATCH options verlc does not model, by long name: {hint: nomultithread, "
                        "overcommit: true} (true: an option without a value). Checked against sbatch's own "
                        "options; those verlc sets are refused (set their field instead).")
    output: Directive = Field("slurm-%j.out", description="#SBATCH --output; its folder must exist where sbatch "
                                                          "runs (Slurm does not create it).")
    error: Directive | None = Field(None, description="#SBATCH --error; default: with the output.")
    npu_gres: GresName | None = Field(
        "npu", description="cluster.accelerator npu: the GRES the site schedules NPUs as (#SBATCH --gres=NAME:N, "
                           "NAME:TYPE:N with cluster.gpu_type); null: the site does not schedule them (whole nodes).")
    mail_type: tuple[MailType, ...] = Field((), description="#SBATCH --mail-type: when Slurm mails about the job, "
                                                            "e.g. [END, FAIL] (ARRAY_TASKS: per sweep variant).")
    mail_user: MailUser | None = Field(None, description="#SBATCH --mail-user; default: Slurm mails the submitter.")
    modules: tuple[Directive, ...] = Field((), description="Environment modules to `module load` first.")
    requeue_grace: Seconds | None = Field(
        300, description="Ask Slurm for USR1 this long before preemption or the time limit; the job then "
                         "stops cleanly and requeues itself, and verl resumes from its checkpoints; so does a job "
                         "that lost a node. null: never requeued (--no-requeue), also not by Slurm on a node failure.")
    array_parallel: Int | None = Field(None, ge=1, description="A sweep: at most this many of its array tasks "
                                                               "run at once (#SBATCH --array=...%N); default: "
                                                               "as many as Slurm schedules.")
    max_requeues: Int = Field(3, ge=0, description="How often the job may be requeued (time limit, preemption, a "
                                                   "lost node) before it fails instead; a requeue after a time "
                                                   "limit that the last attempt reached without saving a new "
                                                   "checkpoint is refused, since it would repeat the same steps.")


def seconds(limit: str) -> int:
    """A Slurm time limit (minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]) in
    seconds."""
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, secs = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + secs
    if len(parts) == 3:
        return (parts[0] * 60 + parts[1]) * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)


def time_limit(spec: Spec) -> TimeLimit | None:
    """cluster.slurm.time; a requeued job (requeue_grace set) may run to it max_requeues times more."""
    slurm = spec.cluster.slurm
    if slurm is None or slurm.time is None:
        return None
    retries = slurm.max_requeues if slurm.requeue_grace is not None else 0
    return TimeLimit(seconds(slurm.time), f"cluster.slurm.time {slurm.time}", retries, "cluster.slurm.max_requeues")
