"""See flash_attn/__init__.py: the names verl imports, each raising when called."""

from . import _missing

index_first_axis = pad_input = rearrange = unpad_input = _missing
