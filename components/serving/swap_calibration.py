"""Fitting a swapped-in version's detection threshold on the swap's driver, before it deploys."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def calibrate_here(config: dict[str, Any]) -> None:
    """Fit the Detector's score threshold for the version ``config`` pins, on this driver, when its
    replicas would otherwise fit it themselves (``calibration_data`` given, no entry in the detector
    file for that version on their runtime and engine), as ``toolscout serve`` does before it starts.

    In the replicas the calibration ran inside the deploy: the model over every valid query, on
    CPU often longer than the swap waits, so a good version was rolled back as a timeout. Done
    here, it is written to the detector file first and the replicas only read it. A version whose
    method detects by itself (MassTool) needs none; replicas on GPUs fit their own (this driver's
    CPU numerics are not theirs); a fit that fails here is logged and left to the replicas.
    """
    from components.serving.models import DEFAULT_ENCODER_RUNTIME, artifact_dir, ensure_calibration

    app = config["applications"][0]
    detector = next((d for d in app.get("deployments") or [] if d["name"] == "Detector"), {})
    user = detector.get("user_config") or {}
    if not (user.get("calibration_data") and user.get("detector_file") and user.get("artifact")):
        return
    # Replica options come from the app's args (the builder's) under the config's own entry.
    built = (app.get("args") or {}).get("deployments") or []
    options = next((d.get("ray_actor_options") or {} for d in built if d.get("name") == "Detector"), {})
    if {**options, **(detector.get("ray_actor_options") or {})}.get("num_gpus"):
        return  # fitted on this driver's CPU, the threshold would be of other numerics (and slow)
    try:
        ensure_calibration(
            artifact_dir(user["artifact"], user.get("source"), user.get("registry")),
            user["calibration_data"],
            user["detector_file"],
            user.get("encoder_runtime", DEFAULT_ENCODER_RUNTIME),
            user.get("splits"),
            user.get("lm_engine"),
            user.get("lm_endpoint"),
        )
    except Exception as e:  # the replicas still can, as before: the swap goes on
        log.warning("calibrating %s on this driver failed (%s); its replicas will", user["artifact"], e)
