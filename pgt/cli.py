"""The `pgt` command. Heavy modules (torch, Ray, MLflow) are imported inside the commands that need them."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path

import typer

app = typer.Typer(
    name="pgt",
    help="Next-location prediction with the Pointer Generator Transformer: preprocessing, training, tuning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class InputFormat(str, Enum):
    geolife_plt = "geolife-plt"
    positionfixes = "positionfixes"
    staypoints = "staypoints"


def _fail(message: str) -> None:
    """One line on stderr, exit code 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@app.command()
def preprocess(
    input: Path = typer.Option(..., "--input", help="A GeoLife folder, or a Parquet/CSV file of GPS points or staypoints."),
    format: InputFormat = typer.Option(..., "--format", help="What --input holds."),
    out: Path = typer.Option(..., "--out", help="Output folder: train/validation/test.parquet, quarantine.parquet, manifest.json."),
    config: Path | None = typer.Option(None, "--config", help="YAML, JSON or TOML file of PreprocessConfig settings."),
    force: bool = typer.Option(False, "--force", help="Recompute even if --out holds the result for this input and config."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar per stage."),
) -> None:
    """Raw GPS points or staypoints -> Parquet sequences, by the reference protocol (SPEC §2)."""
    from preprocessing.config import load_config
    from preprocessing.errors import InputError
    from preprocessing.pipeline import preprocess as run

    try:
        result = run(input, format.value, out, load_config(config), force=force, progress=progress)
    except InputError as exc:
        _fail(str(exc))
    counts = result.manifest["counts"]
    if min(counts["samples"].values()) == 0:
        typer.echo(f"warning: {result.out_dir}: a split has no samples: {counts['users_kept']} users track more than "
                   f"{result.manifest['config']['min_tracking_days']} days, "
                   f"{result.manifest['details']['users_with_samples_in_all_splits']} have samples in all splits", err=True)
    state = "reused" if result.reused else "wrote"
    samples = counts["samples"]
    typer.echo(
        f"{state} {result.out_dir}: {counts['positionfixes_read']:,} rows read, "
        f"{counts['positionfixes_quarantined']:,} quarantined, {counts['staypoints']:,} staypoints, "
        f"{counts['users_kept']} users kept, {counts['locations']:,} locations, samples "
        f"train {samples['train']:,} / validation {samples['validation']:,} / test {samples['test']:,}"
    )


@app.command()
def synth(
    users: int = typer.Option(50, "--users", min=1, help="People to simulate."),
    days: int = typer.Option(120, "--days", min=1, help="Days of tracking per person."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed writes the same file."),
    out: Path = typer.Option(..., "--out", help="Parquet file of GPS points (user_id, tracked_at, latitude, longitude)."),
) -> None:
    """Write synthetic GPS points: homes, workplaces, routines, exploration, noise, gaps, phone-off days."""
    from preprocessing.synthetic import SynthConfig, generate_positionfixes

    if out.suffix != ".parquet":
        _fail(f"{out}: --out must name a .parquet file")
    fixes = generate_positionfixes(SynthConfig(users=users, days=days, seed=seed))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    fixes.write_parquet(tmp, compression="zstd")
    tmp.replace(out)
    typer.echo(f"wrote {out}: {fixes.height:,} GPS points of {users} users over {days} days")


@app.command()
def manifest(folder: Path = typer.Argument(..., help="A `pgt preprocess` output folder.")) -> None:
    """Print the counts and vocabulary sizes of a preprocessed folder."""
    path = folder / "manifest.json"
    if not path.is_file():
        _fail(f"{folder}: no manifest.json; expected a `pgt preprocess` output folder")
    data = json.loads(path.read_text())
    json.dump({"counts": data["counts"], "vocab": data["vocab"]}, sys.stdout, indent=2)
    typer.echo()


if __name__ == "__main__":
    app()
