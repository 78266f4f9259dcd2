"""Create a model's MLflow experiment and registered model once, whichever process gets there first.

Looking a name up and then creating it is two calls: two ``toolscout train`` runs of a new model
(or a train beside a first retrain round) could both find nothing, and the second create raised
``RESOURCE_ALREADY_EXISTS`` after its training had finished, losing that model. A create that
finds the name taken now reads what the other process made.
"""

from __future__ import annotations

import os
from typing import Any

from components.registry.settings import RegistrySettings

TAKEN = "RESOURCE_ALREADY_EXISTS"


def experiment_id(client: Any, settings: RegistrySettings, name: str) -> str:
    """The id of experiment ``name``, created (artifacts under the settings' root) if missing."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = settings.artifact_root
    if location is None and settings.embedded:
        location = os.path.abspath(os.path.join(settings.root, "artifacts"))
    if location and "://" not in location:
        location = os.path.abspath(location)
    target = f"{location.rstrip('/')}/{name}" if location else None
    try:
        return client.create_experiment(name, artifact_location=target)
    except MlflowException as e:
        if e.error_code != TAKEN:
            raise
        return client.get_experiment_by_name(name).experiment_id


def ensure_registered_model(client: Any, name: str) -> None:
    """Create registered model ``name`` unless it exists (or another process creates it first)."""
    from mlflow.exceptions import MlflowException

    if client.search_registered_models(f"name = '{name}'"):
        return
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != TAKEN:
            raise
