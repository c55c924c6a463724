"""The GPU rehearsal's model and data, made offline (no hub, no data set download): a 2-layer random Qwen2 with a
BPE tokenizer trained on the prompts, and GSM8K-shaped parquet files (verl's columns for RL, and `messages`, the
question and its answer, for SFT).

    python3 dev/gpu/fixtures.py FOLDER     # FOLDER/model, FOLDER/data/{train,test}.parquet, FOLDER/hub
    python3 dev/gpu/fixtures.py FOLDER dev/gpu/fit-3b.yaml ...  # then FOLDER/model-fit-3b ...

FOLDER/model-fit* are random models of the shapes dev/gpu/fit*.yaml give in model_shape (real
models' layers), with the same tokenizer: what `verlc plan` predicts for it is checked against what it takes on
the GPU. FOLDER/hub is a Hugging Face hub cache holding the same model as JUDGE (what the judge service serves offline).

A random model learns nothing about arithmetic; the rehearsal shows that verl trains through verlc's bundle
(loss, gradients, rewards logged every step, checkpoints), not that the model gets better.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path

# Qwen's chat format: verl 0.9.1's agent loop builds a Qwen-family model's turns around <|im_end|>
# (verl/utils/tokenizer/continuous_token.py) and refuses a tokenizer without it
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
JUDGE = "genrm"  # the judge service's model (specs/gpu-rehearsal-judge.yaml), as a hub repo id of FOLDER/hub


def problems(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        out.append((f"Tom has {a} apples and buys {b} more. How many apples does Tom have now? "
                    f"Let's think step by step and output the final answer after \"####\".", str(a + b)))
    return out


def tokenizer(texts: list[str], folder: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def model(vocab: int, tok: object, folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, pad_token_id=tok.pad_token_id,  # type: ignore[attr-defined]
                         eos_token_id=tok.eos_token_id, bos_token_id=None)  # type: ignore[attr-defined]
    Qwen2ForCausalLM(config).save_pretrained(folder)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(folder)


def fit_model(tok: object, fixtures: Path, spec: Path) -> None:
    """A random bf16 model of `spec`'s model_shape, in the folder of `fixtures` its `model` names (the vocabulary
    must be the tokenizer's: a sampled id the tokenizer does not have could not be decoded); kept where it is
    already there."""
    import torch
    from ruamel.yaml import YAML
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    own = YAML(typ="safe").load(spec.read_text())
    folder = fixtures / Path(own["model"]).name
    if folder.is_dir():
        return
    shape = dict(own["model_shape"])
    if shape["vocab_size"] != len(tok):  # type: ignore[arg-type]
        raise SystemExit(f"{spec}: model_shape.vocab_size {shape['vocab_size']} is not the tokenizer's {len(tok)}")  # type: ignore[arg-type]
    torch.manual_seed(0)
    config = AutoConfig.for_model(**shape, max_position_embeddings=256, dtype="bfloat16",
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
                                  bos_token_id=None)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(folder)
    tok.save_pretrained(folder)  # type: ignore[attr-defined]


def other_chat(model_folder: Path, folder: Path) -> None:
    """The tiny model with a tokenizer of its own chat tokens, not Qwen's (what the rehearsal's tokenizer was until
    verl 0.9.1's agent loop refused it on the GPU): dev/gpu/cases/chat-tokens-0.9.1.yaml must fail in the
    preflight."""
    import json
    import shutil

    shutil.copytree(model_folder, folder)
    table = json.loads((folder / "tokenizer.json").read_text())
    renames = {"<|im_start|>": "<|turn|>", "<|im_end|>": "<|end|>"}
    for added in table["added_tokens"]:
        added["content"] = renames.get(added["content"], added["content"])
    table["model"]["vocab"] = {renames.get(k, k): v for k, v in table["model"]["vocab"].items()}
    (folder / "tokenizer.json").write_text(json.dumps(table))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        path = folder / name
        if path.is_file():
            text = path.read_text()
            for old, new in renames.items():
                text = text.replace(old, new)
            path.write_text(text)


def hub(model_folder: Path, repo_id: str, cache: Path) -> None:
    """`model_folder` as the hub client leaves a download in its cache `cache` (blobs, a snapshot of links,
    refs/main): a server that lists the models of its cache (`transformers serve`) serves it offline as
    `repo_id`."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "1" * 40
    for path in sorted(p for p in model_folder.rglob("*") if p.is_file()):
        content = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = repo / "snapshots" / commit / path.relative_to(model_folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def data(rows: list[tuple[str, str]], split: str, path: Path) -> None:
    import pandas as pd

    pd.DataFrame([{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": i},
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": f"#### {answer}"}],
    } for i, (question, answer) in enumerate(rows)]).to_parquet(path)


def main(folder: Path) -> None:
    train, test = problems(256, 1), problems(32, 2)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    tok = tokenizer([q for q, _ in train + test] + [a for _, a in train + test], folder / "model")
    model(len(tok), tok, folder / "model")  # type: ignore[arg-type]
    other_chat(folder / "model", folder / "model-other-chat")
    data(train, "train", folder / "data" / "train.parquet")
    data(test, "test", folder / "data" / "test.parquet")
    hub(folder / "model", JUDGE, folder / "hub")
    print(f"fixtures: {folder}/model (vocab {len(tok)}), {len(train)} train and {len(test)} test rows")  # type: ignore[arg-type]


def shapes(folder: Path, specs: list[Path]) -> None:
    """The model of each spec's model_shape that is not in `folder` yet, with the rehearsal's tokenizer (made by
    main first): a few billion random parameters take minutes, so only the shapes a call runs are made."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder / "model")
    for spec in specs:
        fit_model(tok, folder, spec)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        shapes(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
    else:
        main(Path(sys.argv[1]))
