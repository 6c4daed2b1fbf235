"""Where places are: the great-circle distance from the current place to every known place, in the bands whose
biases a place_distance model learns (pgt.network.model), and the window's usual night and day places (usual_places).
The coordinates are the data's (locations.parquet), held by the model as a buffer, so a model loaded back needs no
data to measure them; the usual places come from the visits the model reads."""

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


NIGHT_HOURS = (20, 6)  # usual_places: a visit starting from 20:00 to before 06:00 is a night visit
DAY_HOURS = (8, 18)  # and one starting from 08:00 to before 18:00 a day visit
USUAL_KINDS = 4  # usual_places' flags: 2 * [at the usual night place] + [at the usual day place]


def usual_places(ids: torch.Tensor, times: torch.Tensor, window: torch.Tensor, time_slots: int) -> torch.Tensor:
    """(B, T) flags of each visit: 2 * [its place is the window's usual night place] + [the usual day place], where
    a usual place is the one with the most visits starting at night (NIGHT_HOURS) or in the day (DAY_HOURS) among
    the window's visits (`window` (B, T): True on them; remembered places and padding are not), ties to each; a
    window without such visits has none. `ids` (B, T) tell places apart (visit_ids: unseen places by their slots),
    `times` are the stored time slots + 1, time_slots to a day."""
    hour = ((times - 1).clamp_min(0) * 24) // time_slots  # (B, T) the hour each visit starts in
    night = window & ((hour >= NIGHT_HOURS[0]) | (hour < NIGHT_HOURS[1]))
    day = window & (hour >= DAY_HOURS[0]) & (hour < DAY_HOURS[1])
    same = ids.unsqueeze(2) == ids.unsqueeze(1)  # (B, T, T)
    flags = torch.zeros_like(ids)
    for weight, kind in ((2, night), (1, day)):
        count = (same & kind.unsqueeze(1)).sum(dim=2) * window  # (B, T) the visit's place's visits of that kind
        top = count.amax(dim=1, keepdim=True)  # (B, 1)
        flags = flags + weight * ((count == top) & (top > 0)).long()
    return flags
