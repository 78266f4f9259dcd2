"""New embedded sqlite stores start as a copy of one migrated empty database, made once per process.

MLflow creates a new sqlite tracking database by running its schema migrations (alembic, about a
second on 2 cores). A process that opens many new registries (the test suite, a benchmark with a
registry per run) pays that once: the first new store is migrated in a temporary directory, and
every new store is a copy of it. A database that exists is never touched, and one created by
another process meanwhile is kept (the copy is linked into place, which fails if the name exists).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile


@functools.cache
def _template() -> str:
    """A migrated, empty MLflow sqlite database in a temporary directory (removed at exit)."""
    from mlflow import MlflowClient

    folder = tempfile.mkdtemp(prefix="toolscout-mlflow-template-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, "mlflow.db")
    uri = f"sqlite:///{path}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()  # creates the schema
    return path


def create_from_template(db_path: str) -> None:
    """Give ``db_path`` the migrated empty database if nothing is there yet.

    Where hard links are not supported the database is left for MLflow to create, as it would be
    without this module.
    """
    if os.path.exists(db_path):
        return
    staged = f"{db_path}.{os.getpid()}.new"
    shutil.copyfile(_template(), staged)
    try:
        os.link(staged, db_path)  # no-clobber: a database another process made first stays
    except OSError:
        pass
    finally:
        os.remove(staged)
