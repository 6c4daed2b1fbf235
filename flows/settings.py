"""The flow's parameters resolved once into paths and the typed configs of each package.

The flows' choices are Literals built from the packages' registries, so the Prefect UI offers them as a
dropdown; every default not set by a flow lives in its config dataclass."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic.fields import FieldInfo

from infra.errors import SettingsError
from infra.settings import help_of, settings_of
from infra.state import state_dir as default_state_dir
from pgt.config import RECIPES, LaunchConfig, PredictConfig, TrackingConfig, TrainConfig, base_settings, recipe_label
from pgt.serving.inference import prediction_time
from pgt.tracking.registry import champion_verdict
from pgt.tracking.runs import RECIPE_TAG, resolve_tracking_uri, run_url
from pgt.training.report import metrics_markdown
from preprocessing.config import FORMATS, load_config
from preprocessing.engine import EngineConfig
from preprocessing.pipeline import stage_key
from tune.config import SweepConfig

InputFormat = Literal[FORMATS]
Recipe = Literal[tuple(RECIPES)]


def described(default: Any, description: str) -> Any:
    """A flow parameter's default with its description (the Prefect UI shows it beside the field)."""
    return Field(default, description=description)


def default_of_parameter(parameter: inspect.Parameter) -> Any:
    """A flow parameter's default value (described and from_setting wrap it with its description)."""
    return parameter.default.default if isinstance(parameter.default, FieldInfo) else parameter.default


def flow_defaults(fn) -> dict[str, Any]:
    """Every parameter of a flow's function with its default: what a run without parameters gets."""
    return {name: default_of_parameter(p) for name, p in inspect.signature(fn).parameters.items()}


def from_setting(config: type, name: str, default: Any = dataclasses.MISSING, note: str = "") -> Any:
    """A flow parameter that is a config's setting: its help from the setting's one definition, its default the
    setting's unless the flow's own is given (`note` says what the flow adds)."""
    field = settings_of(config)[name]
    return Field(field.default if default is dataclasses.MISSING else default,
                 description=" ".join(filter(None, (help_of(config, name), note))))

def _absolute(path: str | Path | None) -> Path | None:
    return Path(path).resolve() if path else None


@dataclass
class FlowSettings:
    """The parameters of `preprocess-and-train` resolved: paths made absolute, the tracking URI and the state folder
    chosen. The flow's signature defines the parameters and their defaults; these fields are the same names
    (tests/flows/test_parameters.py holds the two together)."""

    input_path: Path | None  # None: the synthetic default
    input_format: str
    config_file: Path | None  # PreprocessConfig settings; None: the reference protocol
    workers: int
    gpu: bool | None
    tune: bool
    trials: int | None  # None: SweepConfig's
    epochs: int | None  # None: TrainConfig's (or SweepConfig's)
    tracking_uri: str
    address: str | None  # the Ray cluster of training, a sweep and preprocessing's engine
    model_name: str
    state_dir: Path  # every output lives here
    synthetic_users: int
    synthetic_days: int
    recipe: str
    recipe_file: Path | None
    synthetic_seed: int = 0  # not a parameter: the synthetic default is one city

    @classmethod
    def resolve(cls, parameters: dict) -> FlowSettings:
        """The flow's parameters (its locals() on entry) checked and resolved, once, before anything runs: each
        setting by the config it builds (TrainConfig or SweepConfig, LaunchConfig), with that config's message."""
        if parameters["input_format"] not in FORMATS:
            raise SettingsError(f"input_format must be one of {', '.join(FORMATS)}, got {parameters['input_format']!r}")
        if parameters["input_path"] is None and parameters["input_format"] != "positionfixes":
            raise SettingsError("the synthetic default input is positionfixes; give input_path for other formats")
        state = _absolute(parameters["state_dir"]) or default_state_dir()
        settings = cls(**{**parameters, "input_path": _absolute(parameters["input_path"]), "state_dir": state,
                          "config_file": _absolute(parameters["config_file"]),
                          "recipe_file": _absolute(parameters["recipe_file"]),
                          "tracking_uri": resolve_tracking_uri(parameters["tracking_uri"], state)})
        settings.sweep_config() if settings.tune else settings.train_config()
        settings.launch_config()
        return settings

    @property
    def run_name(self) -> str:
        return self.input_path.stem if self.input_path else "synthetic"

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

    def engine_config(self) -> dict:
        """Preprocessing's engine: Ray tasks on the cluster when address is set, else local partitions."""
        engine = "ray" if self.address else "local"
        return EngineConfig(engine, address=self.address, work_dir=self.work_dir / "partitions").to_dict()

    def stage_key(self, hashed) -> str:
        """The cache key of the stages of this input (the first stage's Stage: its hash) under this config."""
        return stage_key(hashed.details["input_sha256"], self.input_format, load_config(self.config_file))

    def train_config(self) -> dict:
        return self._train_config().to_dict()

    def _train_config(self):
        epochs = {"epochs": self.epochs} if self.epochs is not None else {}
        return TrainConfig.from_recipe(base_settings(self.recipe, self.recipe_file), data_dir=str(self.sequences_dir),
                                       out_dir=str(self.runs_dir),
                                       **epochs)

    def launch_config(self) -> dict:
        return dataclasses.asdict(LaunchConfig(workers=self.workers, gpu=self.gpu, address=self.address))

    def tracking_config(self) -> dict:
        return TrackingConfig(self.tracking_uri, experiment="pgt", source="preprocess-and-train flow",
                              tags={RECIPE_TAG: recipe_label(self.recipe, self.recipe_file)}).to_dict()

    def sweep_config(self) -> dict:
        given = {name: value for name, value in (("trials", self.trials), ("epochs", self.epochs)) if value is not None}
        return SweepConfig(data_dir=str(self.sequences_dir), out_dir=str(self.state_dir / "sweeps" / self.run_name),
                           recipe=base_settings(self.recipe, self.recipe_file),
                           recipe_name=recipe_label(self.recipe, self.recipe_file), **given).to_dict()

    def report(self, test: dict, validation: dict, logged: dict, registered: dict) -> str:
        links = {"MLflow run": run_url(logged["tracking_uri"], logged["run_id"]),
                 "registered model": f"models:/{registered['name']}/{registered['version']} ({champion_verdict(registered)})",
                 "sequences": str(self.sequences_dir)}
        what = "sweep" if self.tune else f"training ({self.workers or 1} worker{'s' if self.workers > 1 else ''})"
        return metrics_markdown(test, validation, f"preprocess-and-train: {self.run_name}, {what}", links)


@dataclass
class PredictSettings:
    """The parameters of `predict-next-places` resolved into paths (the flow's signature defines them)."""

    model_name: str
    alias: str
    input_path: Path | None  # None: the last recent_days of the synthetic default
    input_format: str
    top_k: int
    at: datetime | None  # the moment predicted for; None: each user's last visit's end
    recent_days: float
    tracking_uri: str
    state_dir: Path
    synthetic_users: int  # the demo's synthetic default
    synthetic_days: int
    synthetic_seed: int = 0  # not a parameter

    @classmethod
    def resolve(cls, parameters: dict) -> PredictSettings:
        """The predict flow's parameters (its locals() on entry) checked and resolved, once."""
        if parameters["input_format"] not in FORMATS:
            raise SettingsError(f"input_format must be one of {', '.join(FORMATS)}, got {parameters['input_format']!r}")
        PredictConfig(top_k=parameters["top_k"], at=parameters["at"])
        if not parameters["recent_days"] > 0:
            raise SettingsError(f"recent_days must be > 0, got {parameters['recent_days']}")
        state = _absolute(parameters["state_dir"]) or default_state_dir()
        return cls(**{**parameters, "input_path": _absolute(parameters["input_path"]), "state_dir": state,
                      "at": prediction_time(parameters["at"], "at"),
                      "tracking_uri": resolve_tracking_uri(parameters["tracking_uri"], state)})

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
