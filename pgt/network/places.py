"""Where places are: the great-circle distance from the current place to every known place, in the bands whose
biases a place_distance model learns (pgt.network.model). The coordinates are the data's (locations.parquet), held
by the model as a buffer, so a model loaded back needs no data to measure them."""

from __future__ import annotations

import torch

# place_distance: the upper edges (km) of the distance bands, from the current place to each known place, that the
# generator's bias is learned for. Band 0: no distance (the current place or the other one has no coordinates: an
# unseen place, padding); band i: below the i-th edge and at least the one before; the last band: beyond them all.
DISTANCE_EDGES_KM = (0.1, 0.3, 0.6, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 100.0)
EARTH_RADIUS_KM = 6371.0088


def distance_bands(coords: torch.Tensor, edges: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """(B, V) the band (DISTANCE_EDGES_KM) of the great-circle distance from each row's current place (B,) location
    ids) to every location id, from coords (V, 2): latitude and longitude in degrees, NaN where unknown."""
    lat1, lon1 = torch.deg2rad(coords[current]).unsqueeze(1).unbind(-1)  # (B, 1) each
    lat2, lon2 = torch.deg2rad(coords).unbind(-1)  # (V,) each
    a = torch.sin((lat2 - lat1) / 2) ** 2 + torch.cos(lat1) * torch.cos(lat2) * torch.sin((lon2 - lon1) / 2) ** 2
    km = 2 * EARTH_RADIUS_KM * torch.asin(a.clamp(0.0, 1.0).sqrt())  # (B, V), NaN where a place has no coordinates
    bands = torch.bucketize(km, edges, right=True) + 1
    return bands.masked_fill(km.isnan(), 0)
