"""verl's renames: keys a release moved or renamed, which its schema alone cannot show (a new name).

Read by `verlc migrate` (to carry a spec's keys across releases) and `verlc explain` (a key's other names).
"""

from __future__ import annotations

from dataclasses import dataclass

from .release import RELEASES


@dataclass(frozen=True)
class Move:
    """A key verl renamed or moved in `release`: what the schemas alone cannot tell (a new name)."""

    release: str
    old: str
    new: str


# Each entry: the first release with the new name. A prefix moves everything under it.
MOVES = (
    Move("0.4.0", "trainer.val_generations_to_log_to_wandb", "trainer.log_val_generations"),
    # 0.4.1 split `contents` in two; load_contents defaults to save_contents, so one key carries both.
    Move("0.4.1", "actor_rollout_ref.actor.checkpoint.contents", "actor_rollout_ref.actor.checkpoint.save_contents"),
    Move("0.4.1", "critic.checkpoint.contents", "critic.checkpoint.save_contents"),
    # 0.6.0 gathered the profiler's trainer-wide settings in global_profiler, Ray's in ray_kwargs.
    Move("0.6.0", "trainer.profile_steps", "global_profiler.steps"),
    Move("0.6.0", "trainer.controller_nsight_options", "global_profiler.global_tool_config.nsys.controller_nsight_options"),
    Move("0.6.0", "trainer.worker_nsight_options", "global_profiler.global_tool_config.nsys.worker_nsight_options"),
    Move("0.6.0", "ray_init.timeline_json_file", "ray_kwargs.timeline_json_file"),
    Move("0.6.0", "ray_init", "ray_kwargs.ray_init"),
    # 0.6.0 named the LR schedule lr_scheduler_type and kept warmup_style as a deprecated alias (null).
    Move("0.6.0", "actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type"),
    Move("0.6.0", "critic.optim.warmup_style", "critic.optim.lr_scheduler_type"),
    # 0.7.1 moved reward settings under `reward`; these are the keys verl's own migrate_legacy_reward_impl
    # carries from the old places (which 0.7.1+ keeps as null placeholders for it).
    Move("0.7.1", "reward_model.enable", "reward.reward_model.enable"),
    Move("0.7.1", "reward_model.enable_resource_pool", "reward.reward_model.enable_resource_pool"),
    Move("0.7.1", "reward_model.n_gpus_per_node", "reward.reward_model.n_gpus_per_node"),
    Move("0.7.1", "reward_model.nnodes", "reward.reward_model.nnodes"),
    Move("0.7.1", "reward_model.model.path", "reward.reward_model.model_path"),
    Move("0.7.1", "reward_model.rollout", "reward.reward_model.rollout"),
    Move("0.7.1", "reward_model.num_workers", "reward.num_workers"),
    Move("0.7.1", "reward_model.reward_manager", "reward.reward_manager.name"),
    Move("0.7.1", "reward_model.reward_loop_source", "reward.reward_manager.source"),
    Move("0.7.1", "reward_model.reward_loop_module_path", "reward.reward_manager.module.path"),
    Move("0.7.1", "reward_model.reward_loop_class_name", "reward.reward_manager.module.name"),
    Move("0.7.1", "reward_model.sandbox_fusion", "reward.sandbox_fusion"),
    Move("0.7.1", "custom_reward_function", "reward.custom_reward_function"),
    # 0.8.0: the critic's engine settings left its model section; rollout skipping became a section.
    Move("0.8.0", "critic.model.fsdp_config", "critic.fsdp"),
    Move("0.8.0", "actor_rollout_ref.rollout.skip_rollout", "actor_rollout_ref.rollout.skip.enable"),
    Move("0.8.0", "actor_rollout_ref.rollout.skip_dump_dir", "actor_rollout_ref.rollout.skip.dump_dir"),
    Move("0.9.0", "actor_rollout_ref.rollout.skip", "skip.rollout"),
)


# Sections a release keeps only as null placeholders, read by verl's own migration of old specs: a key
# there is carried to its new place (MOVES) and no default is pinned there.
PLACEHOLDERS = (("0.7.1", "reward_model"), ("0.7.1", "custom_reward_function"), ("0.7.1", "sandbox_fusion"))


def placeholder(key: str, release: str) -> bool:
    """Whether `release` keeps `key` only for old specs: a placeholder section, or a renamed key's alias."""
    def under(prefix: str) -> bool:
        return key == prefix or key.startswith(prefix + ".")

    at = RELEASES.index(release)
    return (any(at >= RELEASES.index(since) and under(top) for since, top in PLACEHOLDERS)
            or any(at >= RELEASES.index(m.release) and under(m.old) for m in MOVES))


def carry(key: str, source: str, target: str) -> tuple[str, tuple[Move, ...]]:
    """Where `key` of release `source` is in release `target`, and the moves that took it there."""
    up = RELEASES.index(target) > RELEASES.index(source)
    low, high = sorted((RELEASES.index(source), RELEASES.index(target)))
    crossed = [m for m in MOVES if low < RELEASES.index(m.release) <= high]
    crossed.sort(key=lambda m: (RELEASES.index(m.release), -len(m.old if up else m.new)), reverse=not up)
    used: list[Move] = []
    done: set[str] = set()
    for m in crossed:
        frm, to = (m.old, m.new) if up else (m.new, m.old)
        if m.release in done or not (key == frm or key.startswith(frm + ".")):
            continue
        key = to + key[len(frm):]
        used.append(m)
        done.add(m.release)  # one move per release: the most specific entry
    return key, tuple(used)
