"""The Models tab starts from `tandem ui`'s own flags (issue 64): the pair it was told to load,
its loader settings and its LoRA adapters fill the tab's fields (app/ui_cli.py `page_start`,
app/ui/wizard.py `Start`); without flags, the defaults (app/runtime/defaults.py) and the
embedded pair."""
from __future__ import annotations

from app.cli import build_parser
from app.runtime.defaults import CTX, FLASH_ATTN, GPU_LAYERS, KV_TYPE
from app.runtime.holder import PairHolder
from app.ui import build_app
from app.ui_cli import page_start
from models import embedded

FIELDS = ("wizard-target-file", "wizard-draft-file", "wizard-ctx", "wizard-gpu-layers",
          "wizard-draft-gpu-layers", "wizard-flash-attn", "wizard-kv-type", "wizard-lora",
          "wizard-lora-scale", "wizard-draft-lora")


def fields(argv: list[str], tmp_path) -> dict:
    """The Models tab's starting values on the page `tandem ui ARGV` builds."""
    from loading.chats import ChatStore

    args = build_parser().parse_args(["ui", *argv])
    demo = build_app(PairHolder(), chats=ChatStore(tmp_path / "chats"), start=page_start(args))
    by_id = {c["props"].get("elem_id"): c["props"].get("value")
             for c in demo.config["components"]}
    return {name: by_id[name] for name in FIELDS}


def test_the_models_tab_starts_from_the_ui_flags(tmp_path):
    got = fields(["--target", "/models/big.gguf", "--draft", "none", "--ctx", "2048",
                  "--gpu-layers", "12", "--draft-gpu-layers", "all", "--flash-attn", "on",
                  "--kv-type", "q8_0", "--lora", "/models/style.gguf", "--lora-scale", "0.5"],
                 tmp_path)
    assert got == {"wizard-target-file": "/models/big.gguf", "wizard-draft-file": "",
                   "wizard-ctx": 2048, "wizard-gpu-layers": "12",
                   "wizard-draft-gpu-layers": "all", "wizard-flash-attn": "on",
                   "wizard-kv-type": "q8_0", "wizard-lora": "/models/style.gguf",
                   "wizard-lora-scale": 0.5, "wizard-draft-lora": ""}


def test_without_flags_the_models_tab_starts_from_the_defaults_and_the_embedded_pair(tmp_path):
    got = fields([], tmp_path)
    assert got == {"wizard-target-file": str(embedded.TARGET.path),
                   "wizard-draft-file": str(embedded.DRAFT.path), "wizard-ctx": CTX,
                   "wizard-gpu-layers": GPU_LAYERS, "wizard-draft-gpu-layers": GPU_LAYERS,
                   "wizard-flash-attn": FLASH_ATTN, "wizard-kv-type": KV_TYPE,
                   "wizard-lora": "", "wizard-lora-scale": 1.0, "wizard-draft-lora": ""}
