"""Where other tools keep GGUF files on this machine, and the names a user knows them by.

Searched, in this order (a file reachable from two places is listed once, where first found):
- the Hugging Face hub cache, through huggingface_hub.scan_cache_dir (HF_HUB_CACHE, else
  HF_HOME/hub, else ~/.cache/huggingface/hub): named REPO:FILE;
- LM Studio, ~/.lmstudio/models/PUBLISHER/REPO/FILE and the older ~/.cache/lm-studio/models:
  named PUBLISHER/REPO:FILE;
- Ollama, OLLAMA_MODELS or ~/.ollama/models: each manifest under
  manifests/HOST/NAMESPACE/NAME/TAG names its model layer (media type
  application/vnd.ollama.image.model), whose digest sha256:HEX is the GGUF blob
  blobs/sha256-HEX; named NAME:TAG as `ollama list` shows it (qwen2.5-coder:7b);
- llama.cpp's download cache, LLAMA_CACHE or ~/.cache/llama.cpp (~/Library/Caches/llama.cpp on
  macOS): named by file;
- folders given with --models-dir (repeatable) or TANDEM_MODEL_DIRS (os.pathsep-separated),
  then Tandem's own store: named by file.

Nothing here reads a GGUF header or writes anywhere: files are used where they lie, and an
Ollama blob is only ever read. A manifest whose blob is missing is located with the reason. A
file reachable under several names (two Ollama tags of one blob, a link from one store into
another) keeps the first as its name and answers to the others too.
"""
from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from engine.errors import ModelFileError
from models.tandem_store import store_path

HF, LMSTUDIO, OLLAMA, LLAMA_CPP, FOLDER, TANDEM = "hf", "lmstudio", "ollama", "llama.cpp", "folder", "tandem"
# How each source is called in lists (CLI, app).
LABELS = {HF: "HF cache", LMSTUDIO: "LM Studio", OLLAMA: "Ollama", LLAMA_CPP: "llama.cpp",
          FOLDER: "folder", TANDEM: "Tandem store"}
MODELS_DIRS_ENV = "TANDEM_MODEL_DIRS"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"


@dataclass(frozen=True)
class Place:
    """One place searched, and whether it exists."""
    source: str
    path: Path

    @property
    def exists(self) -> bool:
        return self.path.is_dir()


@dataclass(frozen=True)
class Located:
    """A GGUF file (or an Ollama manifest's blob) found in a place, under the name a user
    types; `problem` says why it cannot be used when that is known without reading it."""
    source: str
    name: str
    path: Path
    problem: str = ""
    # Other names of the same file (another Ollama tag, a link from another place).
    aliases: tuple[str, ...] = ()

    def answers_to(self, names: set[str]) -> bool:
        return self.name in names or any(a in names for a in self.aliases)


def _env_path(var: str) -> Path | None:
    value = os.environ.get(var)
    return Path(value).expanduser() if value else None


def extend_models_dirs(dirs: Sequence[str | Path]) -> None:
    """Add folders to TANDEM_MODEL_DIRS for this process and the ones it starts (`tandem ui
    --models-dir`: every later search, the page's included, looks there too)."""
    if dirs:
        current = [d for d in os.environ.get(MODELS_DIRS_ENV, "").split(os.pathsep) if d]
        os.environ[MODELS_DIRS_ENV] = os.pathsep.join([*map(str, dirs), *current])


def hf_cache_dir() -> Path:
    """huggingface_hub's rule, read at call time (its constants freeze the environment at import)."""
    explicit = _env_path("HF_HUB_CACHE") or _env_path("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return explicit
    home = _env_path("HF_HOME") or (_env_path("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return home / "hub"


def llama_cpp_cache_dir() -> Path:
    """llama.cpp's fs_get_cache_directory: LLAMA_CACHE, else the platform's cache folder."""
    explicit = _env_path("LLAMA_CACHE")
    if explicit:
        return explicit
    if platform.system() == "Darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    return (_env_path("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def places(extra_dirs: Sequence[str | Path] = ()) -> list[Place]:
    """Every place searched, in search order; TANDEM_MODEL_DIRS after the given folders."""
    home = Path.home()
    folders = [Path(d).expanduser() for d in extra_dirs]
    folders += [Path(d).expanduser() for d in os.environ.get(MODELS_DIRS_ENV, "").split(os.pathsep) if d]
    return ([Place(HF, hf_cache_dir()),
             Place(LMSTUDIO, home / ".lmstudio" / "models"),
             Place(LMSTUDIO, home / ".cache" / "lm-studio" / "models"),
             Place(OLLAMA, _env_path("OLLAMA_MODELS") or home / ".ollama" / "models"),
             Place(LLAMA_CPP, llama_cpp_cache_dir())]
            + [Place(FOLDER, f) for f in folders]
            + [Place(TANDEM, store_path())])


def _gguf_files(root: Path, skip: tuple[str, ...] = ()) -> Iterator[Path]:
    """*.gguf under `root`, sorted; symlinked folders are not followed (no loops), symlinked
    files are (a store of links into another tool's store)."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip)
        for f in sorted(files):
            if f.lower().endswith(".gguf"):
                yield Path(folder) / f


def _hf(root: Path, source: str) -> Iterator[Located]:
    try:
        info = scan_cache_dir(root)
    except (CacheNotFound, ValueError, OSError):
        return
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                if f.file_name.lower().endswith(".gguf"):
                    yield Located(source, f"{repo.repo_id}:{f.file_name}", Path(f.file_path))
    for warning in info.warnings:
        yield Located(source, "(unreadable cache entry)", root, f"the cache entry is damaged: {warning}")


def _lmstudio(root: Path) -> Iterator[Located]:
    for path in _gguf_files(root):
        parts = path.relative_to(root).parts
        name = f"{parts[0]}/{parts[1]}:{parts[2]}" if len(parts) == 3 else path.relative_to(root).as_posix()
        yield Located(LMSTUDIO, name, path)


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name `ollama list` shows: NAME:TAG for the library, with namespace and host otherwise."""
    if host == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _ollama(root: Path) -> Iterator[Located]:
    manifests = root / "manifests"
    # A model's "latest" tag usually shares a blob with a named one; the named tag comes first
    # and gives the file its name, "latest" answers as an alias.
    found = [p for p in manifests.glob("*/*/*/*") if p.is_file()]
    for manifest in sorted(found, key=lambda p: (p.parent, p.name == "latest", p.name)):
        name = ollama_name(*manifest.relative_to(manifests).parts)
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
            digest = next((layer["digest"] for layer in layers
                           if layer.get("mediaType") == OLLAMA_MODEL_LAYER), None)
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:
            yield Located(OLLAMA, name, manifest, f"the manifest cannot be read ({type(exc).__name__})")
            continue
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            yield Located(OLLAMA, name, manifest, f"the manifest names no model layer ({OLLAMA_MODEL_LAYER})")
            continue
        blob = root / "blobs" / digest.replace(":", "-", 1)
        problem = "" if blob.is_file() else f"its blob {blob.name} is missing; `ollama pull {name}` fetches it"
        yield Located(OLLAMA, name, blob, problem)


def _llama_cpp(root: Path) -> Iterator[Located]:
    # Newer llama.cpp builds keep -hf downloads in the hub cache's layout; older ones flat files.
    if any(root.glob("models--*")):
        yield from _hf(root, LLAMA_CPP)
    for path in _gguf_files(root, skip=tuple(p.name for p in root.glob("models--*"))):
        yield Located(LLAMA_CPP, path.relative_to(root).as_posix(), path)


def _files(root: Path, source: str, recursive: bool = True) -> Iterator[Located]:
    found = _gguf_files(root) if recursive else sorted(p for p in root.glob("*.gguf") if p.is_file())
    for path in found:
        yield Located(source, path.name, path)


def _in(place: Place) -> Iterator[Located]:
    if not place.exists:
        return
    if place.source == HF:
        yield from _hf(place.path, HF)
    elif place.source == LMSTUDIO:
        yield from _lmstudio(place.path)
    elif place.source == OLLAMA:
        yield from _ollama(place.path)
    elif place.source == LLAMA_CPP:
        yield from _llama_cpp(place.path)
    else:
        # The store's own folders (derived/, pairs/) hold Tandem's derived files, not models.
        yield from _files(place.path, place.source, recursive=place.source != TANDEM)


def _identity(path: Path) -> str:
    try:
        return os.path.realpath(path)
    except OSError:
        return str(path)


def locate(extra_dirs: Sequence[str | Path] = ()) -> list[Located]:
    """Every GGUF in every place, once each (by real path; later names of the same file become
    aliases), with names unique across places: a name another file took is replaced by the
    file's path."""
    first: dict[str, int] = {}
    names: set[str] = set()
    out: list[Located] = []
    for place in places(extra_dirs):
        for item in _in(place):
            key = (_identity(item.path) if not item.problem
                   else f"{item.source}|{item.name}|{item.path}|{item.problem}")
            if key in first:
                if item.name not in names:
                    kept = out[first[key]]
                    out[first[key]] = replace(kept, aliases=kept.aliases + (item.name,))
                    names.add(item.name)
                continue
            if item.name in names:
                item = replace(item, name=str(item.path))
            first[key] = len(out)
            names.add(item.name)
            out.append(item)
    return out


def _ollama_forms(spec: str) -> set[str]:
    """The names an Ollama reference may be written as: without a tag it means :latest, and the
    registry and library prefixes may be spelt out."""
    forms = {spec}
    for prefix in (f"{OLLAMA_REGISTRY}/library/", f"{OLLAMA_REGISTRY}/", "library/"):
        if spec.startswith(prefix):
            forms.add(spec[len(prefix):])
    forms |= {f + ":latest" for f in forms if ":" not in f.rsplit("/", 1)[-1]}
    return forms


def find(spec: str, extra_dirs: Sequence[str | Path] = ()) -> Located | None:
    """The located model a user means by `spec`: its name (Ollama spellings included), else a
    file name that only one located model has."""
    located = locate(extra_dirs)
    forms = _ollama_forms(spec)
    for item in located:
        if item.answers_to(forms):
            return item
    by_file = [item for item in located if item.path.name == spec or item.name.endswith(":" + spec)]
    return by_file[0] if len(by_file) == 1 else None


def usable_path(item: Located) -> Path:
    """The file to load for a located model; one ModelFileError line when it cannot be used."""
    if item.problem:
        raise ModelFileError(f"{item.name} ({LABELS[item.source]}) cannot be used: {item.problem}")
    return item.path


def resolve(spec: str, extra_dirs: Sequence[str | Path] = ()) -> tuple[Path, str]:
    """(path, name) for a model given as a path or as a name from `tandem models list`; the name
    is "" for a path. A spec that is neither is one ModelFileError line; a path-like spec that
    does not exist is returned as is, for loading to report."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path, ""
    item = find(spec, extra_dirs)
    if item is not None:
        return usable_path(item), item.name
    if spec.lower().endswith(".gguf") and ":" not in spec:
        return path, ""
    raise ModelFileError(f"{spec!r} is neither a model file nor a model found on this machine;"
                         " `tandem models list` shows what was found and where it looked")
