"""A stand-in for flash-attn on the GPU rehearsal's machine, which has no flash-attn wheel for its torch (a build
from source needs hours). verl 0.5.0's actor imports `flash_attn.bert_padding` at start-up on CUDA
(verl/workers/actor/dp_actor.py) and calls it only with `use_remove_padding: true`, which the rehearsal's spec
turns off: these names import and raise when called. It has no package metadata, so transformers'
`is_flash_attn_2_available()` stays false: a worker that asks for flash_attention_2 still fails, as it would."""


def _missing(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("flash_attn stand-in (dev/gpu/standin): flash-attn is not installed on this machine")


flash_attn_func = flash_attn_varlen_func = _missing
