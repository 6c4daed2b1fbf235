"""The logged model's doors: logging a checkpoint as the pickle-free pyfunc (with its signature and input
example), and loading one back from any model URI (`models:/`, `runs:/`, a folder), each failure one line."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import torch

import infra
import pgt
import preprocessing
from infra.errors import InputError
from pgt.config import TOP_K
from pgt.network.checkpoint import load_checkpoint
from pgt.tracking.store import check_tracking_server, mlflow_client, resolve_tracking_uri, use_tracking_uri


def log_pytorch_model(checkpoint: Path, data_dir: Path, name: str = "model"):
    """Log best.pt as a models-from-code pyfunc (`pgt/serving/mlflow_model.py`): the weights as a state_dict, the
    model's configuration as JSON (and in the model's metadata), the training data's location and user
    tables and manifest (preprocessing config, feature sizes), the pgt package as code. Nothing is
    pickled, so it loads with MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false. With the places, the staypoints
    DBSCAN clustered and the preprocessing package, it applies the fitted preprocessing to raw GPS
    (mlflow_model.py lists the inputs it takes). The signature declares the table forms predict takes (GPS points,
    staypoints, sequences: mlflow_model.input_schema) and the `top_k` and `at` parameters; the input example is a
    known person's staypoints at the model's own places."""

    import mlflow.pyfunc
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    from pgt.serving.mlflow_model import CONFIG, DATA_FILES, PLACES, USERS, VISITS, WEIGHTS, example_requests, input_schema

    model, cfg = load_checkpoint(checkpoint)
    data_dir = Path(data_dir)
    signature = ModelSignature(inputs=input_schema(pq.read_schema(data_dir / "train.parquet")), outputs=None,
                               params=ParamSchema([ParamSpec("top_k", "long", TOP_K), ParamSpec("at", "string", "")]))
    tables = [data_dir / DATA_FILES[key] for key in (PLACES, USERS)]
    examples = example_requests(*(pl.read_parquet(t) for t in tables)) if all(t.is_file() for t in tables) else []
    with tempfile.TemporaryDirectory() as tmp:
        weights, config = Path(tmp) / "weights.pt", Path(tmp) / "model_config.json"
        torch.save(model.state_dict(), weights)
        config.write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        # the visits only for a model that remembers them: the others' artifacts stay as small as they were
        data = {key: Path(data_dir) / name for key, name in DATA_FILES.items() if key != VISITS or cfg.memory_size}
        artifacts = {WEIGHTS: str(weights), CONFIG: str(config)} | {k: str(v) for k, v in data.items() if v.is_file()}
        with warnings.catch_warnings():  # a folder without places has no example to give
            warnings.filterwarnings("ignore", message=r"(?s).*An input example was not provided")
            return mlflow.pyfunc.log_model(
                name=name, python_model=str(Path(__file__).with_name("mlflow_model.py")), artifacts=artifacts,
                code_paths=[str(Path(package.__file__).parent) for package in (infra, pgt, preprocessing)],
                signature=signature, input_example=pd.DataFrame(examples[0]) if examples else None,
                metadata={"model_config": dataclasses.asdict(cfg)},
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}",
                                  *(f"{dist}=={metadata.version(dist)}" for dist in ("numpy", "pyarrow", "polars", "scikit-learn",
                                                                            "pyyaml", "pandas"))])


MODEL_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/", "file:/", "/")  # what `--model` may name


def check_model_uri(model_uri: str, tracking_uri: str | None = None) -> str:
    """The resolved tracking URI, once the model URI has a form MLflow loads (InputError naming it otherwise) and
    a tracking server it needs answers (check_tracking_server)."""
    uri = resolve_tracking_uri(tracking_uri)
    if not model_uri.startswith(MODEL_SCHEMES) and not Path(model_uri).is_dir():
        raise InputError(f"--model {model_uri}",
                         "expected an MLflow model URI (models:/NAME@ALIAS, models:/NAME/VERSION, "
                         "runs:/RUN_ID/model) or the folder of a logged model")
    if Path(model_uri).is_dir() and not (Path(model_uri) / "MLmodel").is_file():
        raise InputError(f"--model {model_uri}",
                         "a folder without an MLmodel file, so not a logged model; give the "
                         "folder that holds MLmodel (as `mlflow artifacts download` of a model writes it)")
    if model_uri.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        check_tracking_server(uri)
        check_model_exists(model_uri, uri)
    return uri


def check_model_exists(model_uri: str, tracking_uri: str) -> None:
    """InputError in one line, saying which part is missing and how to fix it, unless the registered model and its
    alias or version, or the run and its model path, exist in the store."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    where = f"in {tracking_uri}"
    if model_uri.startswith("models:/"):
        ref = model_uri.removeprefix("models:/")
        if "@" not in ref and "/" not in ref:  # MLflow 3's models:/<model_id>: a logged model, registered or not
            try:
                client.get_logged_model(ref)
            except MlflowException:
                raise InputError(f"--model {model_uri}",
                                 f"no logged model {ref!r} {where}; choose another "
                                 "--tracking-uri, or name a registered model (models:/NAME@ALIAS)") from None
            return
        name, alias = ref.split("@", 1) if "@" in ref else (ref.rsplit("/", 1)[0], None)
        try:
            model = client.get_registered_model(name)
        except MlflowException:
            raise InputError(f"--model {model_uri}",
                             f"no registered model {name!r} {where}; `pgt train --register "
                             f"{name}` registers one, or choose another --tracking-uri") from None
        if alias is not None:
            if alias not in (model.aliases or {}):
                known = ", ".join(sorted(model.aliases or {})) or "none"
                raise InputError(f"--model {model_uri}",
                                 f"model {name!r} has no alias {alias!r} {where} (its aliases: "
                                 f"{known}); `pgt train --register {name}` sets champion on the first version")
            return
        version = ref.rsplit("/", 1)[1]
        if version.lower() == "latest":  # MLflow resolves it to the newest version, which exists if the model does
            return
        try:
            client.get_model_version(name, version)
        except MlflowException:
            raise InputError(f"--model {model_uri}", f"model {name!r} has no version {version!r} {where}") from None
    elif model_uri.startswith("runs:/"):
        run_id, _, path = model_uri.removeprefix("runs:/").partition("/")
        try:
            client.get_run(run_id)
        except MlflowException:
            raise InputError(f"--model {model_uri}", f"no run {run_id!r} {where}") from None
        if path and not client.list_artifacts(run_id, path):
            raise InputError(f"--model {model_uri}",
                             f"run {run_id} has no model at {path!r} (pgt logs it at "
                             f"runs:/{run_id}/model)")


def model_flavors(model_uri: str) -> dict:
    """A logged model's flavours, read from its MLmodel: a model folder works with any tracking store, or none
    (MLflow's get_model_info would look the folder's model id up in the current store)."""
    from mlflow.models import Model, get_model_info

    if Path(model_uri).is_dir():
        return Model.load(str(Path(model_uri) / "MLmodel")).flavors
    return get_model_info(model_uri).flavors


def load_pgt_model(model_uri: str, tracking_uri: str | None = None):
    """A logged pgt model's pyfunc wrapper (`pgt.serving.mlflow_model.PGTModel`): `.packed` (the torch module),
    its training data's tables and `.fitted()` (the fitted preprocessing). Nothing is unpickled."""
    use_tracking_uri(check_model_uri(model_uri, tracking_uri))
    if "pytorch" in model_flavors(model_uri):
        raise InputError(model_uri, "logged before models carried their preprocessing (a pickled PyTorch model); "
                                    "train it again to score raw GPS")
    return _pyfunc_wrapper(model_uri)


def _pyfunc_wrapper(model_uri: str):
    import mlflow.pyfunc

    wrapper = mlflow.pyfunc.load_model(model_uri).unwrap_python_model()
    if getattr(wrapper, "packed", None) is None:
        raise InputError(model_uri, f"not a pgt model (its python model is {type(wrapper).__name__})")
    return wrapper


def load_model_and_manifest(model_uri: str, tracking_uri: str | None = None) -> tuple:
    """(a logged model's PackedModel, in eval mode on the CPU; the manifest.json of its training data, or None for
    a model logged before models carried it): what scoring and lineage checks need. Models logged by this
    version load without unpickling anything; those logged before it (the pickled PyTorch flavour) load only
    where MLflow allows pickle."""
    import mlflow
    use_tracking_uri(check_model_uri(model_uri, tracking_uri))
    if "pytorch" in model_flavors(model_uri):  # logged before models-from-code
        import mlflow.pytorch

        return mlflow.pytorch.load_model(model_uri, map_location="cpu").eval(), None
    wrapper = _pyfunc_wrapper(model_uri)
    return wrapper.packed, wrapper.manifest
