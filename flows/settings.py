"""Each flow's parameters as one pydantic model, and those parameters resolved once into paths and the typed
configs of each package.

A flow's parameter model (PreprocessAndTrainParameters, PredictNextPlacesParameters) defines every parameter
once: its type, default and description, the settings' help taken from their config's one definition. The flow's
signature is generated from the model (`parameters_flow`), so the Prefect UI shows the fields as a form and a
deployment's parameters stay flat. Choices are Literals built from the packages' registries (a dropdown); every
default not set by a flow lives in its config dataclass."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, get_args

from prefect import flow, get_run_logger
from prefect.states import Failed
from prefect.utilities.hashing import file_hash
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from infra.errors import SettingsError, UserError
from infra.settings import help_of, interval_text, schema_bounds, settings_of
from infra.state import state_dir as default_state_dir
from infra.storage import is_uri, open_storage, without_query
from pgt.config import LaunchConfig, PredictConfig, TrackingConfig, TrainConfig, base_settings
from pgt.options import flag_of
from pgt.recipes import RECIPES, recipe_label
from pgt.serving.inference import prediction_time
from pgt.tracking.registry import champion_verdict
from pgt.tracking.runs import RECIPE_TAG, run_url
from pgt.tracking.store import resolve_tracking_uri
from pgt.training.report import metrics_markdown
from preprocessing.config import FORMATS, SynthConfig, load_config
from preprocessing.engine import EngineConfig
from preprocessing.pipeline import stage_key
from tune.config import SweepConfig

InputFormat = Literal[FORMATS]
Recipe = Literal[tuple(RECIPES)]


def described(default: Any, description: str, **bounds: float) -> Any:
    """A flow parameter's default with its description (the Prefect UI shows it beside the field), and its bounds
    where it has any (pydantic's gt, ge, lt, le: the parameter schema's, which Prefect's server checks)."""
    return Field(default, description=description, **bounds)


def default_of_parameter(parameter: inspect.Parameter) -> Any:
    """A flow parameter's default value (described and from_setting wrap it with its description)."""
    return parameter.default.default if isinstance(parameter.default, FieldInfo) else parameter.default


def flow_defaults(fn) -> dict[str, Any]:
    """Every parameter of a flow's function with its default: what a run without parameters gets."""
    return {name: default_of_parameter(p) for name, p in inspect.signature(fn).parameters.items()}


def from_setting(config: type, name: str, default: Any = dataclasses.MISSING, note: str = "") -> Any:
    """A flow parameter that is a config's setting: its help and bounds from the setting's one definition, its
    default the setting's unless the flow's own is given (`note` says what the flow adds). The bounds are the
    parameter schema's minimum and maximum: Prefect's server refuses a run outside them before the run exists."""
    field = settings_of(config)[name]
    return Field(field.default if default is dataclasses.MISSING else default,
                 description=" ".join(filter(None, (help_of(config, name), note))), **schema_bounds(field))


def interval_of(field: FieldInfo) -> str:
    """A parameter's bounds (pydantic's ge, gt, le, lt) as the settings write them ("[1, 1048576]", "(0, inf)")."""
    bounds = {kind: getattr(m, kind) for m in field.metadata for kind in ("ge", "gt", "le", "lt") if hasattr(m, kind)}
    return interval_text(bounds.get("ge", bounds.get("gt")), bounds.get("le", bounds.get("lt")),
                         low_open="gt" in bounds, high_open="lt" in bounds)


def _absolute(path: str | Path | None) -> Path | None:
    if path and is_uri(path):  # a URI read as a path would become a local folder named "s3:"
        raise SettingsError(f"{path}: a local path here (or a mount every node shares); input_path and storage "
                            "take a URI")
    return Path(path).resolve() if path else None


STATE_DIR_HELP = "The folder every output goes to. Empty: $PGT_STATE_DIR, else .state."
INPUT_FORMAT_HELP = "What input_path holds."


class FlowParameters(BaseModel):
    """A flow's parameters: one field each, with its type, default and description. Unknown names are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def checked(cls, values: FlowParameters | dict) -> FlowParameters:
        """The parameters from a run's values, every problem in one SettingsError (the CLI's words for them)."""
        if isinstance(values, cls):
            return values
        try:
            return cls(**values)
        except ValidationError as error:
            raise SettingsError("; ".join(cls._problem(e) for e in error.errors())) from None

    @classmethod
    def _problem(cls, error: dict) -> str:
        name = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            return f"unknown parameter {name} (known: {', '.join(cls.model_fields)})"
        if error["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            return f"{name} must be in {interval_of(cls.model_fields[name])}, got {error['input']!r}"
        if error["type"] == "literal_error":
            choices = get_args(cls.model_fields[name].annotation)
            return f"{name} must be one of {', '.join(map(str, choices))}, got {error['input']!r}"
        return f"{name}: {error['msg'][0].lower()}{error['msg'][1:]}, got {error['input']!r}"


class PreprocessAndTrainParameters(FlowParameters):
    """The parameters of `preprocess-and-train`."""

    input_path: str | None = described(None, "GPS points or staypoints: a GeoLife folder, or a Parquet or CSV file; "
                                             "a path, or its URI on object storage (s3://, gs://), copied to the "
                                             "state folder. Empty: the synthetic default city.")
    input_format: InputFormat = described("positionfixes", INPUT_FORMAT_HELP)
    config_file: str | None = described(None, "A YAML, JSON or TOML file of PreprocessConfig settings. Empty: the "
                                              "reference protocol.")
    workers: int = from_setting(LaunchConfig, "workers", 2)
    gpu: bool | None = from_setting(LaunchConfig, "gpu")
    tune: bool = described(False, "A Ray Tune sweep of `trials` trials instead of one training run.")
    trials: int | None = from_setting(SweepConfig, "trials", None, "Empty: the sweep config's default.")
    finalists: int | None = from_setting(SweepConfig, "finalists", None, "Empty: the sweep config's default.")
    confirm_seeds: int | None = from_setting(SweepConfig, "confirm_seeds", None, "Empty: the sweep config's default.")
    epochs: int | None = from_setting(TrainConfig, "epochs", None, "Empty: the recipe's, or the sweep's.")
    tracking_uri: str | None = from_setting(TrackingConfig, "tracking_uri")
    address: str | None = from_setting(LaunchConfig, "address")
    model_name: str = described("pgt", "The registered model; its alias champion moves to the new version only "
                                       "when its mean strict validation Acc@1 over its seeds beats the champion's "
                                       "by more than seed noise, on the same data.")
    state_dir: str | None = described(None, STATE_DIR_HELP)
    synthetic_users: int = from_setting(SynthConfig, "users")
    synthetic_days: int = from_setting(SynthConfig, "days")
    recipe: Recipe = described("paper", "The training recipe: paper (the published settings), tuned (ours for "
                                        "GeoLife) or ensemble (tuned, several networks side by side).")
    recipe_file: str | None = described(None, "A YAML file of training settings (a sweep's winner) instead of "
                                              "recipe; it sets any training setting.")
    cluster: str | None = described(None, "A Ray cluster's Jobs API (http://HEAD:8265): the training or the sweep runs "
                                          "there as a Ray Job, reading the sequences from and keeping its run under "
                                          "storage; preprocessing, evaluation and registration stay with the flow. "
                                          "Empty: Ray runs here, or joins address.")
    storage: str | None = described(None, "With cluster: where the sequences and the run or sweep are kept for "
                                          "every node: object storage (s3://BUCKET/FOLDER, gs://...) or a folder "
                                          "every node mounts at one path.")


class PredictNextPlacesParameters(FlowParameters):
    """The parameters of `predict-next-places`."""

    model_name: str = described("pgt-demo", "The registered model to score with.")
    alias: str = described("champion", "The alias of the version to score with: champion, the best so far.")
    input_path: str | None = described(None, "New GPS points or staypoints: a GeoLife folder, or a Parquet or CSV "
                                             "file. Empty: the last recent_days of the synthetic default.")
    input_format: InputFormat = described("positionfixes", INPUT_FORMAT_HELP)
    top_k: int = from_setting(PredictConfig, "top_k")
    at: str | None = from_setting(PredictConfig, "at")
    recent_days: float = described(14.0, "With no input_path: the days of the synthetic default to score.", gt=0)
    tracking_uri: str | None = from_setting(TrackingConfig, "tracking_uri")
    state_dir: str | None = described(None, STATE_DIR_HELP)
    synthetic_users: int = from_setting(SynthConfig, "users")
    synthetic_days: int = from_setting(SynthConfig, "days")


def flow_signature(model: type[FlowParameters], returns: Any = dict) -> inspect.Signature:
    """A flat, keyword-only signature of the model's fields, each default carrying its description and each type its
    bounds (Prefect reads constraints from the annotation only): what Prefect reads to build a deployment's
    parameter schema (the UI's form) and to validate a run's parameters."""
    return inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=Field(field.default, description=field.description),
                           annotation=Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation)
         for name, field in model.model_fields.items()],
        return_annotation=returns)


def parameters_flow(model: type[FlowParameters], **flow_options) -> Callable:
    """A Prefect flow whose parameters are the model's fields and whose function receives them as one model. A
    UserError (bad input, settings, a server that does not answer) ends the run Failed with its one line as the
    state's message and the log's; anything else keeps Prefect's traceback (a bug should look like a bug).

        @parameters_flow(PredictNextPlacesParameters, name="predict-next-places")
        def predict_next_places(parameters: PredictNextPlacesParameters) -> dict: ...
    """
    def decorate(fn: Callable[[Any], Any]):
        signature = flow_signature(model, inspect.signature(fn).return_annotation)

        def run(**values):
            try:
                return fn(model.checked(values))
            except UserError as error:  # what the user can fix: one line in the run's log and state, no traceback
                get_run_logger().error(f"error: {error}")
                # a caller in Python still gets the error raised, without the frames of where it was found
                return Failed(message=str(error), data=error.with_traceback(None))

        run.__name__, run.__qualname__, run.__doc__, run.__module__ = fn.__name__, fn.__qualname__, fn.__doc__, fn.__module__
        run.__signature__ = signature
        run.__annotations__ = {name: p.annotation for name, p in signature.parameters.items()} | {"return": dict}
        run.parameters_model = model
        # the flow's version is its own file's, as Prefect gives a flow defined in place (run's code is here)
        return flow(**{"version": file_hash(inspect.getsourcefile(fn)), **flow_options})(run)

    return decorate


@dataclass(frozen=True)
class ResolvedParameters:
    """A flow's parameters with their paths made absolute, the state folder and the tracking URI chosen. Every
    other parameter reads through to the model, by the same name."""

    parameters: FlowParameters
    input_path: Path | str | None  # None: the synthetic default; a str: a URI on object storage
    state_dir: Path  # every output lives here
    tracking_uri: str

    def __getattr__(self, name: str) -> Any:
        if name == "parameters":  # not set yet (copying, unpickling): no parameter to read through to
            raise AttributeError(name)
        return getattr(self.parameters, name)

    @staticmethod
    def _paths(parameters: FlowParameters) -> dict[str, Any]:
        if parameters.input_path is None and parameters.input_format != "positionfixes":
            raise SettingsError("the synthetic default input is positionfixes; give input_path for other formats")
        state = _absolute(parameters.state_dir) or default_state_dir()
        given = parameters.input_path
        stored = open_storage(given) if given and is_uri(given) else None
        input_path = (stored.local or stored.uri) if stored else _absolute(given)
        return {"parameters": parameters, "input_path": input_path, "state_dir": state,
                "tracking_uri": resolve_tracking_uri(parameters.tracking_uri, state)}


@dataclass(frozen=True)
class FlowSettings(ResolvedParameters):
    """The parameters of `preprocess-and-train` resolved (PreprocessAndTrainParameters defines them)."""

    config_file: Path | None = None  # PreprocessConfig settings; None: the reference protocol
    recipe_file: Path | None = None
    synthetic_seed: int = 0  # not a parameter: the synthetic default is one city

    @classmethod
    def resolve(cls, parameters: PreprocessAndTrainParameters | dict) -> FlowSettings:
        """The flow's parameters checked and resolved, once, before anything runs: each setting by the config it
        builds (TrainConfig or SweepConfig, LaunchConfig), with that config's message."""
        checked = PreprocessAndTrainParameters.checked(parameters)
        _check_cluster(checked)
        settings = cls(**cls._paths(checked), config_file=_absolute(checked.config_file),
                       recipe_file=_absolute(checked.recipe_file))
        for config in ("sweep_config" if settings.tune else "train_config", "launch_config", "tracking_config"):
            getattr(settings, config)  # each built once, now: a bad setting fails the run before any task
        return settings

    @property
    def run_name(self) -> str:
        return PurePosixPath(without_query(self.input_path)).stem if self.input_path else "synthetic"

    @property
    def input_uri(self) -> str | None:
        """input_path where it names object storage; the flow then works on a copy (inputs_dir)."""
        return self.input_path if isinstance(self.input_path, str) else None

    @property
    def inputs_dir(self) -> Path:
        """The local copies of inputs named by a URI, one folder per content."""
        return self.state_dir / "inputs"

    @property
    def synthetic_file(self) -> Path:
        return self.state_dir / "data" / f"synthetic-{self.synthetic_users}u-{self.synthetic_days}d-{self.synthetic_seed}.parquet"

    @property
    def sequences_dir(self) -> Path:
        config = f"-{self.config_file.stem}" if self.config_file else ""
        return self.state_dir / "sequences" / f"{self.run_name}{config}"

    @property
    def runs_dir(self) -> Path:
        """Training output; one per recipe, since a rerun resumes only a run of the same settings."""
        return self.state_dir / "runs" / (self.run_name if self.recipe_name == "paper" else f"{self.run_name}-{self.recipe_name}")

    @property
    def recipe_name(self) -> str:
        """The recipe file's name (its stem) when one is given, else the named recipe."""
        return self.recipe_file.stem if self.recipe_file else self.recipe

    @property
    def work_dir(self) -> Path:
        return self.state_dir / "stages"

    @cached_property
    def engine_config(self) -> EngineConfig:
        """Preprocessing's engine: Ray tasks on the cluster when address is set, else local partitions."""
        engine = "ray" if self.address else "local"
        return EngineConfig(engine, address=self.address, work_dir=self.work_dir / "partitions")

    def stage_key(self, hashed) -> str:
        """The cache key of the stages of this input (the first stage's Stage: its hash) under this config."""
        return stage_key(hashed.details["input_sha256"], self.input_format, load_config(self.config_file))

    @cached_property
    def train_config(self) -> TrainConfig:
        epochs = {"epochs": self.epochs} if self.epochs is not None else {}
        return TrainConfig.from_recipe(base_settings(self.recipe, self.recipe_file), data_dir=str(self.sequences_dir),
                                       out_dir=str(self.runs_dir),
                                       **epochs)

    @cached_property
    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(workers=self.workers, gpu=self.gpu, address=self.address)

    @cached_property
    def tracking_config(self) -> TrackingConfig:
        return TrackingConfig(self.tracking_uri, experiment="pgt", source="preprocess-and-train flow",
                              tags={RECIPE_TAG: recipe_label(self.recipe, self.recipe_file)})

    @cached_property
    def sweep_config(self) -> SweepConfig:
        given = {name: getattr(self, name) for name in ("trials", "epochs", "finalists", "confirm_seeds")
                 if getattr(self, name) is not None}
        return SweepConfig(data_dir=str(self.sequences_dir), out_dir=str(self.state_dir / "sweeps" / self.run_name),
                           recipe=base_settings(self.recipe, self.recipe_file),
                           recipe_name=recipe_label(self.recipe, self.recipe_file), **given)

    @property
    def kept_sequences(self) -> str:
        """With cluster: the sequences' folder under storage, which every node reads."""
        return open_storage(self.storage).uri_of("sequences", self.sequences_dir.name)

    @cached_property
    def cluster_job(self) -> ClusterJob:
        """With cluster: the `pgt train` or `pgt tune` the flow runs there, its data and output under storage; the
        same settings as the flow's own training or sweep (the recipe, epochs, workers, trials, tracking)."""
        kept = open_storage(self.storage)
        given = {name: getattr(self, name) for name in (("trials", "epochs", "finalists", "confirm_seeds") if self.tune
                                                        else ("epochs",)) if getattr(self, name) is not None}
        settings = [arg for name, value in given.items() for arg in (flag_of(name), str(value))]
        tracking = ["--tracking-uri", self.tracking_uri, "--experiment", self.tracking_config.experiment]
        if self.tune:
            out = kept.uri_of("sweeps", self.run_name)
            return ClusterJob(["tune", "--data", self.kept_sequences, "--out", out, "--recipe", self.recipe, *settings,
                               *tracking], out, "tune.json", resume=["tune", "--resume", out])
        out = kept.uri_of("runs", self.runs_dir.name)
        gpu = [] if self.gpu is None else ["--gpu" if self.gpu else "--no-gpu"]
        return ClusterJob(["train", "--data", self.kept_sequences, "--out", out, "--recipe", self.recipe,
                           "--workers", str(self.workers), *gpu, *settings, *tracking], out, "metrics.json")

    def report(self, test: dict, validation: dict, logged: dict, registered: dict) -> str:
        links = {"MLflow run": run_url(logged["tracking_uri"], logged["run_id"]),
                 "registered model": f"models:/{registered['name']}/{registered['version']} ({champion_verdict(registered)})",
                 "sequences": self.kept_sequences if self.cluster else str(self.sequences_dir)}
        what = "sweep" if self.tune else f"training ({self.workers or 1} worker{'s' if self.workers > 1 else ''})"
        return metrics_markdown(test, validation, f"preprocess-and-train: {self.run_name}, {what}", links)


@dataclass(frozen=True)
class ClusterJob:
    """A `pgt` command the flow runs on a Ray cluster as a Ray Job, and where it keeps its result."""

    start: list[str]  # the command's arguments after `pgt`
    out: str  # its --out: a URI, or a folder every node mounts
    record: str  # the JSON file it keeps there with its result: metrics.json (train) or tune.json (tune)
    resume: list[str] | None = None  # a sweep whose record (sweep.json) is kept at out already: continued


def _check_cluster(parameters: PreprocessAndTrainParameters) -> None:
    """SettingsError for cluster and storage given apart, or with what cannot go to the cluster."""
    if parameters.cluster is None:
        if parameters.storage is not None:
            raise SettingsError("storage keeps a cluster's data and runs: give cluster (http://HEAD:8265) too, or leave "
                                "storage empty (the state folder keeps them here)")
        return
    problems = []
    if not parameters.storage:
        problems.append("cluster needs storage, where every node reads the sequences and keeps the run: "
                        "s3://BUCKET/FOLDER, gs://..., or a folder every node mounts")
    elif not is_uri(parameters.storage) and not Path(parameters.storage).is_absolute():
        problems.append(f"storage {parameters.storage}: a URI or an absolute path (the nodes do not share this "
                        "working folder)")
    if parameters.address:
        problems.append("cluster runs the job on the cluster, address joins Ray from here: give one of them")
    if parameters.recipe_file:
        problems.append("recipe_file is a file of this machine, which the cluster's nodes do not read: with cluster, "
                        "name a recipe")
    if parameters.workers == 0 and not parameters.tune:
        problems.append("workers 0 trains in the job's driver on the head, which keeps no run on storage: give "
                        "workers 1 or more")
    if problems:
        raise SettingsError("; ".join(problems))


@dataclass(frozen=True)
class PredictSettings(ResolvedParameters):
    """The parameters of `predict-next-places` resolved (PredictNextPlacesParameters defines them)."""

    at: datetime | None = None  # the moment predicted for; None: each user's last visit's end
    synthetic_seed: int = 0  # not a parameter

    @classmethod
    def resolve(cls, parameters: PredictNextPlacesParameters | dict) -> PredictSettings:
        """The predict flow's parameters checked and resolved, once."""
        checked = PredictNextPlacesParameters.checked(parameters)
        PredictConfig(top_k=checked.top_k, at=checked.at)
        if checked.input_path and is_uri(checked.input_path):
            raise SettingsError(f"input_path {checked.input_path}: predict-next-places reads a local file or folder")
        return cls(**cls._paths(checked), at=prediction_time(checked.at, "at"))

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_name}@{self.alias}"

    @property
    def synthetic_file(self) -> Path:
        return self.state_dir / "data" / f"synthetic-{self.synthetic_users}u-{self.synthetic_days}d-{self.synthetic_seed}.parquet"

    @property
    def recent_file(self) -> Path:
        return self.state_dir / "data" / f"{self.synthetic_file.stem}-last{self.recent_days:g}d.parquet"

    @property
    def out_dir(self) -> Path:
        name = self.model_uri.removeprefix("models:/").replace("@", "-").replace("/", "-")
        return self.state_dir / "predictions" / name

    @property
    def predictions_file(self) -> Path:
        return self.out_dir / "predictions.parquet"

    @property
    def map_file(self) -> Path:
        return self.out_dir / "map.png"
