"""The shipped models' data for tests, read the way group_vars/all reads it
(module_utils/plan/model_data.py), so that tests never copy a model's flags or repositories."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml
from ansible.module_utils.plan.model_data import config_paths, load_model, serving_definitions

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
DEFAULT = "kimi-k2.6"


def model(name: str = DEFAULT) -> dict:
    return load_model(MODELS, name, yaml.safe_load)


def definitions(name: str = DEFAULT, budgets=None, tp_sizes=None) -> dict:
    """kimi_serving_config_definitions as group_vars/all gives them for the model: budgets
    default to the model's kimi_ddtree_budgets."""
    data = model(name)
    return serving_definitions(
        data, data["ddtree_budgets"] if budgets is None else budgets, tp_sizes
    )


def configs(name: str = DEFAULT) -> dict[str, str]:
    """kimi_model_configs: the shipped config.json of the target and of each drafter."""
    return config_paths(model(name), MODELS)


# K2.6's first special tokens, at the ids its tokenizer_config.json's added_tokens_decoder
# gives them (above the 163584 tiktoken ranks; the simulator's EOS_ID is <|im_end|>).
KIMI_SPECIALS = {163584: "[BOS]", 163585: "[EOS]", 163586: "<|im_end|>", 163587: "<|im_user|>"}


def write_kimi_tokenizer(folder: Path, ranks: int = 2000, revision: str | None = None) -> Path:
    """A K2.6-shaped tokenizer in folder, small enough for a test host: tiktoken.model with
    `ranks` tokens (one `<base64 bytes> <rank>` a line, as K2.6 ships it) and
    tokenizer_config.json whose added_tokens_decoder holds KIMI_SPECIALS, plus
    kimi-manifest.json naming `revision` when given. Enough for synthetic workloads
    (module_utils/benchmark/workloads.py); every id it yields is inside K2.6's 163840 vocabulary."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = (f"{base64.b64encode(b'tok%d' % rank).decode()} {rank}\n" for rank in range(ranks))
    (folder / "tiktoken.model").write_text("".join(lines))
    decoder = {str(i): {"content": name, "special": True} for i, name in KIMI_SPECIALS.items()}
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config["added_tokens_decoder"] = decoder
    config_path.write_text(json.dumps(config))
    if revision is not None:
        manifest = folder / "kimi-manifest.json"
        data = json.loads(manifest.read_text()) if manifest.exists() else {}
        manifest.write_text(json.dumps({**data, "revision": revision}))
    return folder


# Where the kit's deploy puts K2.6 on a host, and the manifest its weights stage writes there.
HOST_MODEL_DIR = "/opt/kimi/weights/moonshotai/Kimi-K2.6"


def place_kimi_model_files(cluster, host: str, chat_template: str) -> None:
    """What a host's benchmark reads of a deployed K2.6 without its weights: the weights
    stage's manifest, tokenizer_config.json (the chat template) and tiktoken.model."""
    import shutil
    import tempfile

    manifest = json.dumps(
        {
            "repo_id": "moonshotai/Kimi-K2.6",
            "revision": "a" * 40,
            "verify_mode": "full",
            "files": {"config.json": {}},
        }
    )
    folder = Path(tempfile.mkdtemp())
    try:
        write_kimi_tokenizer(folder)
        cluster.ssh(
            host,
            f"mkdir -p {HOST_MODEL_DIR} && cat > {HOST_MODEL_DIR}/tokenizer_config.json"
            f" && echo '{manifest}' > {HOST_MODEL_DIR}/kimi-manifest.json",
            input=json.dumps({"chat_template": chat_template}),
        )
        cluster.ssh(
            host,
            f"cat > {HOST_MODEL_DIR}/tiktoken.model",
            input=(folder / "tiktoken.model").read_text(),
        )
    finally:
        shutil.rmtree(folder)
