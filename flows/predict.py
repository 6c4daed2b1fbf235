"""The Prefect flow `predict-next-places`: new raw GPS -> the champion's fitted preprocessing -> each user's top-k
next places with coordinates -> a table, a map and an MLflow run. The flow only wires tasks.

    prefect deployment run predict-next-places/predict      (see prefect.yaml)
"""

from __future__ import annotations

from flows import tasks
from flows.settings import PredictNextPlacesParameters, PredictSettings, parameters_flow


@parameters_flow(PredictNextPlacesParameters, name="predict-next-places", log_prints=True)
def predict_next_places(parameters: PredictNextPlacesParameters) -> dict:
    """Score new GPS data with models:/model_name@alias and publish each user's next places.

    input_path None takes the last recent_days days of the synthetic default (synthetic_users people over
    synthetic_days days, as the demo deployment trains on). The predictions
    (Parquet), the map (PNG) and a summary are logged to an MLflow run in the experiment pgt-predictions."""
    s = PredictSettings.resolve(parameters)  # first: every parameter checked before anything runs
    source = s.input_path
    if source is None:
        synthetic = tasks.synthetic_input(s.synthetic_file, s.synthetic_users, s.synthetic_days, s.synthetic_seed)
        source = tasks.recent_input(synthetic, s.recent_days, s.recent_file)
    version = tasks.resolve_model_version(s.tracking_uri, s.model_uri)  # before predicting: the alias may move
    answering = version["version_uri"] if version else s.model_uri
    predictions = tasks.predict_places(answering, source, s.input_format, s.predictions_file, s.top_k, s.tracking_uri,
                                       s.at)
    png = tasks.map_png(predictions, s.map_file)
    logged = tasks.log_predictions(s.tracking_uri, s.model_uri, predictions, png, source, s.top_k, version)
    tasks.publish_predictions(predictions, logged, s.model_uri)
    return {"predictions": str(predictions), "map": str(png), **logged}


if __name__ == "__main__":
    predict_next_places()
