"""Composer's ``SFTPObjectStore``: files on an SFTP server, through fsspec's ``sftp``
filesystem (paramiko).

Source: Composer 0.32.1 ``composer/utils/object_store/sftp_object_store.py`` (the
constructor's arguments, defaults, the ``sftp://`` URI form and its errors, the environment
variables).
"""

from __future__ import annotations

import os
import pathlib
import urllib.parse
from typing import Any, Optional, Union

from cadence.utils.file_helpers import FsspecObjectStore
from cadence.utils.import_helpers import MissingConditionalImportError

__all__ = ["SFTPObjectStore"]


def _uri_parts(host: str, port: int, username: Optional[str], password: Optional[str],
               cwd: str) -> tuple[str, int, Optional[str], Optional[str], str]:
    """``host`` as Composer reads it: a host name, or ``sftp://user:pw@host:port/./rel`` (a
    path after a double ``//`` is absolute)."""
    url = urllib.parse.urlsplit(host)
    if url.scheme == "":
        return host, port, username, password, cwd
    if url.scheme.lower() != "sftp":
        raise ValueError("If specifying a URI, only the sftp scheme is supported.")
    if not url.hostname:
        raise ValueError("If specifying a URI, the URI must include the hostname.")
    if url.username:
        if username is not None:
            raise ValueError("If specifying the username in the `host`, then the `username` "
                             "argument must be blank.")
        username = url.username
    if url.password:
        if password is not None:
            raise ValueError("If specifying the password in the `host`, then the `password` "
                             "argument must be blank.")
        password = url.password
    if url.port:
        if port != 22:
            raise ValueError("If specifying the port in the `host`, then the `port` argument "
                             "must be blank.")
        port = url.port
    if url.query or url.fragment:
        raise ValueError("Query and fragment parameters are not supported as part of a URI.")
    return url.hostname, port, username, password, url.path[1:] if url.path else cwd


class SFTPObjectStore(FsspecObjectStore):
    """Objects under folder ``cwd`` of SFTP server ``host`` (connected at construction, as
    Composer does).

    Args:
        host: the server, or a URI ``sftp://user@host:port/./relative/path`` (``//absolute``).
        port: the port. Default 22.
        username, password: credentials. Default None (the SSH config's, an agent's keys).
        known_hosts_filename: a known-hosts file. Default None: ``known_hosts_filename_environ``
            (``COMPOSER_SFTP_KNOWN_HOSTS_FILE``) when set, else the system's.
        key_filename: a private key file, tried besides ``~/.ssh``'s. Default None:
            ``key_filename_environ`` (``COMPOSER_SFTP_KEY_FILE``) when set.
        missing_host_key_policy: paramiko's policy for an unknown host key: a class name
            (``'RejectPolicy'``, the default, ``'AutoAddPolicy'``, ``'WarningPolicy'``) or
            an instance; kept as the attribute ``missing_host_key_policy`` (fsspec's sftp
            filesystem connects with its own policy: unlike Composer, it is not applied).
        cwd: the folder object names are relative to. Default ``''`` (the login folder).
        connect_kwargs: more keyword arguments for paramiko's ``SSHClient.connect``.

    Raises:
        MissingConditionalImportError: paramiko is not installed
            (``pip install 'cadence[sftp]'``).
        ValueError: a URI ``host`` of another scheme, without a host name, with a query, or
            repeating an argument also given (username, password, port).
    """

    def __init__(self, host: str, port: int = 22, username: Optional[str] = None,
                 password: Optional[str] = None,
                 known_hosts_filename: Optional[Union[pathlib.Path, str]] = None,
                 known_hosts_filename_environ: str = "COMPOSER_SFTP_KNOWN_HOSTS_FILE",
                 key_filename: Optional[Union[pathlib.Path, str]] = None,
                 key_filename_environ: str = "COMPOSER_SFTP_KEY_FILE",
                 missing_host_key_policy: Union[str, Any] = "RejectPolicy",
                 cwd: str = "", connect_kwargs: Optional[dict[str, Any]] = None) -> None:
        if known_hosts_filename is None:
            known_hosts_filename = os.environ.get(known_hosts_filename_environ)
        self.known_hosts_filename = known_hosts_filename
        if key_filename is None:
            key_filename = os.environ.get(key_filename_environ)
        self.key_filename = key_filename
        try:
            import paramiko
        except ImportError as exc:
            raise MissingConditionalImportError("sftp", "paramiko") from exc
        host, port, username, password, cwd = _uri_parts(host, port, username, password, cwd)
        options: dict[str, Any] = dict(connect_kwargs or {})
        options.update(host=host, port=port)
        for key, value in (("username", username), ("password", password),
                           ("key_filename", key_filename)):
            if value is not None:
                options[key] = os.fspath(value)
        if isinstance(missing_host_key_policy, str):
            missing_host_key_policy = getattr(paramiko.client, missing_host_key_policy)()
        self.missing_host_key_policy = missing_host_key_policy
        self.host, self.port, self.cwd = host, port, cwd
        super().__init__(f"sftp://{host}/{cwd}".rstrip("/"), options)

    def get_uri(self, object_name: str) -> str:
        """``sftp://<host>:<port>/<cwd>/<object_name>``."""
        path = f"{self.cwd.rstrip('/')}/{object_name}" if self.cwd else object_name
        return f"sftp://{self.host}:{self.port}/{path}"
