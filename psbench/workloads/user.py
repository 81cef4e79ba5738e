"""The user's own workloads: a model factory and a dataset loader from the user's modules, named by
import strings (`pkg.module:callable`), given as a pair or in a workload file (TOML).

A RunSpec's workload name says where such a workload comes from, so every process of a run (PS
shards and workers, DDP ranks, Spark executors, Ray actors) resolves it the same way, through
`registry.get_workload`:

    MODEL+DATASET              e.g. my_models:make_net+my_data:load (each an import string or a
                               built-in model / dataset name)
    /abs/path/workload.toml    a workload file (the launcher makes its path absolute)

The calls (docs/workloads.md):

    factory(input_shape, n_classes, **model_options) -> torch.nn.Module
        called after torch.manual_seed(run seed), as the built-in models are: same seed, same weights
    loader(seed, data_dir) -> (x_train, y_train, x_val, y_val) or a datasets.Dataset
        seed is the data seed (registry.DATA_SEED, fixed like a benchmark's split); data_dir is the
        run's --data-dir or None. x is converted to float32, y must be integers (to int64).

A module is imported from sys.path, else from the workload file's folder, else from the current
directory (as `python -m` would); the folders found that way are kept (`import_roots`) and put on
the PYTHONPATH of every process a system starts (systems.common.child_env).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from psbench.core.configfile import load_config
from psbench.core.errors import ConfigError
from psbench.workloads.datasets import Dataset

if TYPE_CHECKING:
    from torch import nn

IMPORT_STRING = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
PAIR_SEPARATOR = "+"
FILE_SUFFIX = ".toml"
# A pair names no training settings: these hold unless the run sets its own (--batch-size, --epochs,
# --lr); no target accuracy, so no time to target (a workload file can give one).
PAIR_SETTINGS: dict[str, Any] = {"batch_size": 32, "epochs": 1, "target_accuracy": None}
FILE_KEYS = {"description": str, "model": str, "dataset": str, "model_options": dict, "optimizer": dict,
             "batch_size": int, "epochs": int, "target_accuracy": float}
OPTIMIZER_KEYS = ("lr", "momentum", "weight_decay")

_ROOTS: list[str] = []  # folders user modules were imported from, for child processes' PYTHONPATH


def is_user_workload(name: str) -> bool:
    return is_workload_file(name) or PAIR_SEPARATOR in name


def is_workload_file(name: str) -> bool:
    return name.endswith(FILE_SUFFIX)


def is_import_string(name: str) -> bool:
    return ":" in name


def pair_name(model: str, dataset: str) -> str:
    """The workload name of --model MODEL --dataset DATASET."""
    for what, ref in (("--model", model), ("--dataset", dataset)):
        if not ref or PAIR_SEPARATOR in ref or (is_import_string(ref) and not IMPORT_STRING.fullmatch(ref)):
            raise ConfigError(f"{what} '{ref}': give pkg.module:callable (or a built-in name, see `psbench list`)")
    return f"{model}{PAIR_SEPARATOR}{dataset}"


def canonical_name(workload: str, base: Path | None = None) -> str:
    """A workload file's name made absolute (relative to `base`, else the current directory), so a
    process with another working directory finds it; every other name as it is."""
    if not is_workload_file(workload):
        return workload
    return str((Path(base or Path.cwd()) / Path(workload).expanduser()).resolve())


def import_roots() -> list[str]:
    return list(_ROOTS)


# ---- resolving import strings ------------------------------------------------------------------

def _module_root(module: Any, module_name: str) -> str | None:
    """The folder on sys.path that `module_name` was imported from."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)
    return str(path.parents[depth])


def resolve(ref: str, what: str, folder: Path | None = None) -> Callable[..., Any]:
    """The callable an import string names; an import that fails, a missing attribute or one not
    callable is one line naming it."""
    if not IMPORT_STRING.fullmatch(ref):
        raise ConfigError(f"{what} '{ref}': not an import string; give pkg.module:callable")
    module_name, _, attr = ref.partition(":")
    top = module_name.split(".")[0]
    # where a child process would not look by itself: a folder put on sys.path here, or the current
    # directory (on sys.path as '' under `python -m`); a module from the environment's own path is not
    needs_passing = {str(Path.cwd().resolve())}
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        for root in (folder, Path.cwd()):
            if root is not None and ((root / top).is_dir() or (root / f"{top}.py").is_file()):
                sys.path.insert(0, str(root))
                needs_passing.add(str(Path(root).resolve()))
                importlib.invalidate_caches()
                break
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # not found, or the module's own code raising on import
        raise ConfigError(f"{what} '{ref}': importing {module_name} failed: {_one_line(exc)}") from None
    root = _module_root(module, module_name)
    if root in needs_passing and root not in _ROOTS:
        _ROOTS.append(root)
    target = getattr(module, attr, None)
    if target is None:
        raise ConfigError(f"{what} '{ref}': module {module_name} ({getattr(module, '__file__', '?')}) has no "
                          f"attribute '{attr}'")
    if not callable(target):
        raise ConfigError(f"{what} '{ref}': {attr} is a {type(target).__name__}, not a callable")
    return target


def _one_line(exc: BaseException) -> str:
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _call(ref: str, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what} '{ref}' raised {_one_line(exc)}") from None


# ---- the loader's data --------------------------------------------------------------------------

_DATA: dict[tuple[str, int, str | None], Dataset] = {}  # the last loader's data in this process


def load_user_dataset(ref: str, seed: int, data_dir: Path | None, folder: Path | None = None) -> Dataset:
    """The loader's data, checked and converted; loaded once a process (plan, run and manifest ask)."""
    key = (ref, seed, None if data_dir is None else str(data_dir))
    if key not in _DATA:
        loader = resolve(ref, "dataset loader", folder)
        data = checked_dataset(ref, _call(ref, "dataset loader", loader, seed, data_dir))
        _DATA.clear()
        _DATA[key] = data
    return _DATA[key]


def checked_dataset(ref: str, returned: Any) -> Dataset:
    """(x_train, y_train, x_val, y_val) or a Dataset as psbench trains on it: x float32 (n, ...),
    y int64 (n,) in 0..n_classes-1; anything else is one line naming the loader and what is wrong."""
    what = f"dataset loader '{ref}'"
    if isinstance(returned, Dataset):
        parts, n_classes = (returned.x_train, returned.y_train, returned.x_val, returned.y_val), returned.n_classes
    elif isinstance(returned, (tuple, list)) and len(returned) == 4:
        parts, n_classes = tuple(returned), None
    else:
        got = f"a {type(returned).__name__} of {len(returned)}" if isinstance(returned, (tuple, list)) else \
            f"a {type(returned).__name__}"
        raise ConfigError(f"{what} returned {got}; expected (x_train, y_train, x_val, y_val) or a "
                          "psbench.workloads.datasets.Dataset")
    names = ("x_train", "y_train", "x_val", "y_val")
    arrays = {}
    for name, value in zip(names, parts):
        try:
            arrays[name] = np.asarray(value)
        except Exception as exc:
            raise ConfigError(f"{what}: {name} is not an array ({_one_line(exc)})") from None
    for split in ("train", "val"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype.kind not in "fiu" or x.ndim < 2:
            raise ConfigError(f"{what}: x_{split} has dtype {x.dtype} and shape {x.shape}; expected numbers "
                              "of shape (examples, features...), converted to float32")
        if y.dtype.kind not in "iu" or y.ndim != 1:
            raise ConfigError(f"{what}: y_{split} has dtype {y.dtype} and shape {y.shape}; expected integer class "
                              "labels of shape (examples,), converted to int64")
        if len(x) != len(y) or len(x) == 0:
            raise ConfigError(f"{what}: x_{split} has {len(x)} examples and y_{split} {len(y)}; expected the same "
                              "number, at least 1")
    if arrays["x_train"].shape[1:] != arrays["x_val"].shape[1:]:
        raise ConfigError(f"{what}: x_train's examples have shape {arrays['x_train'].shape[1:]}, x_val's "
                          f"{arrays['x_val'].shape[1:]}; expected the same")
    x_train, x_val = (np.ascontiguousarray(arrays[k], dtype=np.float32) for k in ("x_train", "x_val"))
    y_train, y_val = (np.ascontiguousarray(arrays[k], dtype=np.int64) for k in ("y_train", "y_val"))
    if not (np.isfinite(x_train).all() and np.isfinite(x_val).all()):
        raise ConfigError(f"{what}: x holds NaN or infinite values (after conversion to float32)")
    low, high = min(y_train.min(), y_val.min()), max(y_train.max(), y_val.max())
    n_classes = int(high) + 1 if n_classes is None else int(n_classes)
    if low < 0 or high >= n_classes or n_classes < 2:
        raise ConfigError(f"{what}: labels run {low}..{high} for {n_classes} classes; expected 0..n_classes-1, "
                          "at least 2 classes")
    if isinstance(returned, Dataset):
        return Dataset(returned.name, x_train, y_train, x_val, y_val, n_classes, returned.fingerprint)
    return Dataset(ref, x_train, y_train, x_val, y_val, n_classes)


# ---- the factory's model ------------------------------------------------------------------------

def build_user_model(ref: str, input_shape: tuple[int, ...], n_classes: int, seed: int,
                     folder: Path | None = None, **options: Any) -> nn.Module:
    import torch

    factory = resolve(ref, "model factory", folder)
    torch.manual_seed(seed)
    model = _call(ref, "model factory", factory, tuple(input_shape), n_classes, **options)
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"model factory '{ref}' returned a {type(model).__name__}; expected a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"model factory '{ref}' returned a {type(model).__name__} with no trainable parameters")
    return model


def check_forward(ref: str, model: nn.Module, data: Dataset) -> None:
    """The model takes two validation examples and gives (2, n_classes) scores: a mismatch is one line
    at plan time, not a traceback from inside a worker."""
    import torch

    x = torch.from_numpy(data.x_val[:2])
    with torch.no_grad():
        out = _call(ref, "model factory's model", model.eval(), x)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(x), data.n_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model factory '{ref}': its model maps a batch of shape {tuple(x.shape)} to {shape}; "
                          f"expected ({len(x)}, {data.n_classes}) class scores")


# ---- workload files and pairs, as Workload fields -------------------------------------------------

def workload_fields(name: str) -> dict[str, Any]:
    """The Workload(...) fields of a user workload name (a pair or a workload file), and `folder`,
    where the file's modules are looked for first."""
    if is_workload_file(name):
        return _file_fields(Path(name))
    model, _, dataset = name.partition(PAIR_SEPARATOR)
    pair_name(model, dataset)  # checks both halves
    return {"name": name, "model": model, "dataset": dataset, "optimizer": {}, "model_options": {},
            "description": f"the user's model {model} on the user's data {dataset}", "folder": None,
            **PAIR_SETTINGS}


def _file_fields(path: Path) -> dict[str, Any]:
    where = f"workload file {path}"
    raw = load_config(path, "workload file")
    unknown = sorted(set(raw) - set(FILE_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(FILE_KEYS)}")
    for key in ("model", "dataset"):
        if key not in raw:
            raise ConfigError(f"{where}: needs {key} = \"pkg.module:callable\" (or a built-in name)")
    for key, kind in FILE_KEYS.items():
        value = raw.get(key)
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else \
            isinstance(value, kind) and not isinstance(value, bool)
        if not ok or (kind in (int, float) and not value > 0) or (key == "target_accuracy" and value > 1):
            allowed = {str: "text", dict: "a table", int: "an integer >= 1", float: "a number in (0, 1]"}[kind]
            raise ConfigError(f"{where}: {key} = {value!r}; allowed: {allowed}")
    optimizer = raw.get("optimizer", {})
    bad = sorted(set(optimizer) - set(OPTIMIZER_KEYS))
    wrong = [k for k in OPTIMIZER_KEYS if k in optimizer and (isinstance(optimizer[k], bool) or not
             isinstance(optimizer[k], (int, float)) or optimizer[k] < 0 or (k == "lr" and optimizer[k] == 0))]
    if bad or wrong:
        raise ConfigError(f"{where}: [optimizer] {(bad or wrong)[0]}; allowed: lr > 0, momentum >= 0, "
                          "weight_decay >= 0")
    return {"name": str(path), "model": raw["model"], "dataset": raw["dataset"],
            "optimizer": {k: float(v) for k, v in optimizer.items()}, "model_options": raw.get("model_options", {}),
            "batch_size": raw.get("batch_size", PAIR_SETTINGS["batch_size"]),
            "epochs": raw.get("epochs", PAIR_SETTINGS["epochs"]),
            "target_accuracy": float(raw["target_accuracy"]) if "target_accuracy" in raw else None,
            "description": raw.get("description", f"workload file {path.name}"), "folder": path.parent}


def provenance(name: str, model: str, dataset: str) -> dict[str, Any]:
    """Where a user workload came from, for the manifest: the file or the import strings, and the
    sha256 of every file they read (the workload file, the model's and loader's modules)."""
    out: dict[str, Any] = {"model": model, "dataset": dataset}
    files: dict[str, str] = {}
    if is_workload_file(name):
        out["workload_file"] = name
        files[name] = _sha256(Path(name))
    for ref in (model, dataset):
        if is_import_string(ref):
            module = sys.modules.get(ref.partition(":")[0])
            file = getattr(module, "__file__", None)
            if file:
                files[str(Path(file).resolve())] = _sha256(Path(file))
    out["sha256"] = files
    return out


def _sha256(path: Path) -> str:
    return f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def pythonpath_with_roots(pythonpath: str) -> str:
    """PYTHONPATH with the folders user modules came from added at its end."""
    parts = [p for p in pythonpath.split(os.pathsep) if p]
    return os.pathsep.join(parts + [r for r in _ROOTS if r not in parts])
