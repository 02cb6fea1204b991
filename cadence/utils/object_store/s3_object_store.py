"""Composer's ``S3ObjectStore``: an S3 (or S3-compatible) bucket, through s3fs.

Source: Composer 0.32.1 ``composer/utils/object_store/s3_object_store.py`` (the constructor's
arguments and defaults, ``get_uri``/``get_key``, ``S3_ENDPOINT_URL``).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from cadence.utils.file_helpers import FsspecObjectStore
from cadence.utils.import_helpers import MissingConditionalImportError

__all__ = ["S3ObjectStore"]


class S3ObjectStore(FsspecObjectStore):
    """The objects of S3 bucket ``bucket`` under ``prefix``: object ``a.pt`` is
    ``s3://<bucket>/<prefix>/a.pt``. Nothing is contacted at construction.

    Credentials are best left to the environment (``AWS_ACCESS_KEY_ID``...,
    ``AWS_PROFILE``); the arguments override it.

    Args:
        bucket: the bucket's name (``/`` stripped).
        prefix: a folder prepended to object names, e.g. ``'folder/sub/'``. Default ``''``.
        region_name: the region. Default None (the environment's).
        endpoint_url: an S3-compatible service's URL. Default None: ``S3_ENDPOINT_URL`` from
            the environment when set (Composer's rule), else AWS (or ``AWS_ENDPOINT_URL``).
        aws_access_key_id, aws_secret_access_key, aws_session_token: credentials. Default
            None (the environment's).
        client_config: keyword arguments of :class:`botocore.config.Config` (``retries``...).
            Default None.
        transfer_config: Composer's boto3 ``TransferConfig`` arguments; accepted and kept as
            the attribute ``transfer_config`` (s3fs has its own transfers). Default None.

    Raises:
        MissingConditionalImportError: s3fs is not installed (``pip install 'cadence[s3]'``).
    """

    def __init__(self, bucket: str, prefix: str = "", region_name: Optional[str] = None,
                 endpoint_url: Optional[str] = None,
                 aws_access_key_id: Optional[str] = None,
                 aws_secret_access_key: Optional[str] = None,
                 aws_session_token: Optional[str] = None,
                 client_config: Optional[dict[Any, Any]] = None,
                 transfer_config: Optional[dict[Any, Any]] = None) -> None:
        try:
            import s3fs  # noqa: F401
        except ImportError as exc:
            raise MissingConditionalImportError("s3", "s3fs") from exc
        self.bucket = bucket.strip("/")
        self.prefix = prefix.strip("/")
        if self.prefix:
            self.prefix += "/"
        if endpoint_url is None:
            endpoint_url = os.environ.get("S3_ENDPOINT_URL")
        self.transfer_config = dict(transfer_config or {})
        options: dict[str, Any] = {}
        for key, value in (("key", aws_access_key_id), ("secret", aws_secret_access_key),
                           ("token", aws_session_token), ("endpoint_url", endpoint_url)):
            if value is not None:
                options[key] = value
        if region_name is not None:
            options["client_kwargs"] = {"region_name": region_name}
        if client_config:
            options["config_kwargs"] = dict(client_config)
        super().__init__(f"s3://{self.bucket}/{self.prefix}".rstrip("/"), options or None)

    def get_key(self, object_name: str) -> str:
        """The S3 key of ``object_name``: ``prefix + object_name``."""
        return f"{self.prefix}{object_name}"

    def get_uri(self, object_name: str) -> str:
        """``s3://<bucket>/<prefix><object_name>``."""
        return f"s3://{self.bucket}/{self.get_key(object_name)}"
