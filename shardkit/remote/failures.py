"""What went wrong in a remote call: retried or not, and a message that says what to check.

Backends raise their own exception types (botocore, aiohttp, gcsfs...) and s3fs turns S3 errors
into ``OSError`` subclasses that keep the server's error as ``__cause__``; nothing here imports a
backend: classes are recognised by name along the exception's chain.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Callable

# botocore's configuration and credential errors: the same call fails the same way again.
_PERMANENT_TYPES = {"NoCredentialsError", "PartialCredentialsError", "ProfileNotFound",
                    "ParamValidationError", "InvalidConfigError", "UnknownSignatureVersionError",
                    "NoRegionError", "InvalidRegionError", "UnknownCredentialError",
                    "CredentialRetrievalError", "InvalidEndpointConfigurationError"}
# S3 error codes a retry cannot change.
_PERMANENT_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket",
                    "NoSuchKey", "AllAccessDisabled", "InvalidBucketName", "AccountProblem",
                    "InvalidArgument", "InvalidRequest", "MethodNotAllowed", "NotImplemented",
                    "AuthorizationHeaderMalformed", "ExpiredToken", "InvalidToken",
                    "UnauthorizedAccess", "Forbidden", "403", "404", "NotFound"}
_HINTS = {
    "InvalidAccessKeyId": "check the access key (AWS_ACCESS_KEY_ID or storage_options 'key')",
    "SignatureDoesNotMatch": "check the secret key (AWS_SECRET_ACCESS_KEY or storage_options "
                             "'secret')",
    "AccessDenied": "check that these credentials may read/write this bucket and prefix",
    "Forbidden": "check the credentials and that they may use this bucket and prefix",
    "403": "check the credentials and that they may use this bucket and prefix",
    "NoSuchBucket": "check the bucket name in the URL and the endpoint (AWS_ENDPOINT_URL)",
    "ExpiredToken": "refresh the session token (AWS_SESSION_TOKEN)",
}
# Bytes damaged or cut short on the way: sending them again can succeed.
_TRANSIT_CODES = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "IncompleteBody",
                  "RequestTimeout", "SlowDown", "InternalError", "ServiceUnavailable"}
# Refusals that may pass for an object just listed: access refused by a policy or credentials
# being renewed (a provider refreshes an expiring session token), or an object a replica does
# not have yet. Retried where the caller knows the object exists (``RemoteTarget.retry``'s
# ``refusals``), then an error: never taken for a missing file.
_MAY_PASS = {"AccessDenied", "ExpiredToken", "TokenRefreshRequired", "Forbidden", "403",
             "NoSuchKey", "404", "NotFound"}
# Local (this machine's) faults while writing a download: never the remote object's fault.
LOCAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


class TransferDeadline(Exception):
    """A download cut at its deadline (``access.transfer_deadline``): its text says so; retried."""


@dataclass(frozen=True)
class Failure:
    """One failed remote call, classified."""

    transient: bool  # may succeed on retry
    message: str  # what happened, for "URL/NAME: <message>"
    missing: bool = False  # the object (or its bucket) does not exist
    code: str | None = None  # the server's error code, when it sent one
    refused: bool = False  # a refusal or a "not found" that may pass (see _MAY_PASS)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 8:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _server_error(chain: list[BaseException]) -> tuple[str, int | None, str] | None:
    """``(code, HTTP status, message)`` of the first server error response in the chain."""
    for exc in chain:
        response: Any = getattr(exc, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            err = response["Error"]
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return str(err.get("Code") or status or "?"), status, str(err.get("Message") or "")
    return None


def _client_fault(chain: list[BaseException]) -> Failure | None:
    """A request the HTTP client refused to send (botocore's bare ``HTTPClientError`` over a
    ``ValueError``/``TypeError``: e.g. credentials in the endpoint URL): the same request is
    refused again, so not retried. Network faults are subclasses (``ConnectionClosedError``,
    ``ReadTimeoutError``...) or other errors underneath, and stay retried."""
    for exc in chain:
        if type(exc).__name__ == "HTTPClientError":
            cause = (getattr(exc, "kwargs", None) or {}).get("error")
            if isinstance(cause, (ValueError, TypeError)) and not isinstance(cause, OSError):
                return Failure(False, f"the HTTP client refused the request ({describe(cause)}); "
                                      "check the endpoint URL and storage_options (credentials "
                                      "go in 'key'/'secret' or the environment, not in the "
                                      "URL)")
    return None


def describe(exc: BaseException) -> str:
    """``Type: text`` of an exception (its text on one line)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(exc: BaseException, read_timeout: float | None = None) -> Failure:
    """How a failed remote call is reported and whether it is retried."""
    if isinstance(exc, TransferDeadline):
        return Failure(True, str(exc))
    chain = _chain(exc)
    names = set().union(*(_names(e) for e in chain))
    server = _server_error(chain)
    if server is not None:
        code, status, text = server
        what = f"HTTP {status} {code}" if status else code
        what += f": {' '.join(text.split())}" if text else ""
        missing = code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound")
        hint = _HINTS.get(code)
        if code == "NoSuchBucket":
            message = f"the bucket does not exist ({what}); {hint}"
        elif missing:
            message = f"object not found ({what})"
        elif status == 403 or code in _HINTS:
            message = f"access denied by the server ({what}); {hint or _HINTS['403']}"
        else:
            message = f"the server answered {what}"
        transient = code in _TRANSIT_CODES or not (
            missing or code in _PERMANENT_CODES
            or (status is not None and 400 <= status < 500 and status not in (408, 429)))
        return Failure(transient, message, missing, code, code in _MAY_PASS)
    if names & _PERMANENT_TYPES:
        hint = ("set credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or "
                "storage_options 'key'/'secret'; storage_options {'anon': True} for a public "
                "bucket)" if "Credential" in str(names) or "NoCredentialsError" in names
                else "check storage_options and the AWS configuration")
        return Failure(False, f"{describe(exc)}; {hint}")
    client = _client_fault(chain)
    if client is not None:
        return client
    if isinstance(exc, FileNotFoundError):
        return Failure(False, "object not found", True, refused=True)
    if isinstance(exc, PermissionError):
        return Failure(False, f"access denied ({describe(exc)}); {_HINTS['403']}", refused=True)
    if any("Timeout" in n for n in names):
        bound = f"{read_timeout:g} s" if read_timeout else "its read timeout"
        return Failure(True, f"the endpoint stopped answering or sending data (no byte for "
                             f"{bound}; {describe(exc)}); check the network and the endpoint, or "
                             "raise storage_options={'config_kwargs': {'read_timeout': ...}}")
    return Failure(True, describe(exc))


def local_fault(exc: BaseException, part: str, where: Callable[[str], str]) -> str | None:
    """The message for a fault of this machine's cache while writing download file ``part``,
    else None; ``where(name)`` names the object being downloaded."""
    if not isinstance(exc, OSError) or getattr(exc, "__cause__", None) is not None:
        return None  # s3fs's translations of server errors keep the server's as the cause
    code = exc.errno
    folder = os.path.dirname(part)
    # The object, not the .part file: limit.part_name(name, size, tag) = ".NAME.SIZE-TAG.part"
    name = os.path.basename(part)[1:].removesuffix(".part").rsplit(".", 1)[0]
    hint = f"while downloading {where(name)}; check cache_dir and cache_limit"
    if code == errno.ENOSPC:
        return f"no space left in {folder} (the cache disk is full) {hint}"
    if code in LOCAL_ERRNOS:
        what = {errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "the cache filesystem is read-only"}[code]
    elif not os.path.isdir(folder):
        what = "the cache folder was removed while in use"
    elif not os.access(folder, os.W_OK):
        what = "the cache folder is not writable"
    else:
        return None
    return f"cache {folder}: {what} ({os.strerror(code) if code else type(exc).__name__}) {hint}"
