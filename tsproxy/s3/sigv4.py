"""AWS Signature Version 4 verification for S3, sans-IO.

Two forms reach an S3 endpoint: the `Authorization: AWS4-HMAC-SHA256 ...` header, and presigned URLs
(`X-Amz-Algorithm`, `X-Amz-Credential`, ... in the query). Both sign the same canonical request:

    METHOD \n URI \n QUERY \n HEADERS \n SIGNED-HEADERS \n PAYLOAD-HASH

with S3's rules: the path is URI-encoded once (never normalised or encoded twice), query pairs are
encoded and sorted (`name=` when empty), header values trimmed with inner whitespace folded, and the
payload hash is the `x-amz-content-sha256` value (a hex digest, `UNSIGNED-PAYLOAD` or a `STREAMING-*`
mode). Clients disagree on how they put some characters on the wire, so the path and the query are tried
in their canonical encoding first and as sent second; both forms name the same resource.

SigV2 (`AWS key:sig`, `AWSAccessKeyId=`) is verified by `sigv2`, and `auth.authenticate` picks the
scheme; called directly, this module refuses SigV2 with a clear InvalidRequest. SigV4a is not supported.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote, unquote_to_bytes

from tsproxy import errors

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
TERMINATOR = "aws4_request"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
SHA256_PAYLOAD = "SHA256"  # payload_mode when the client sent a hex digest of the body
PAYLOAD_MODES = (UNSIGNED_PAYLOAD, STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER)
SIGNED_STREAMING = (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)

MAX_PRESIGNED_EXPIRES = 7 * 24 * 3600
PRESIGN_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders")
AMZ_DATE = "%Y%m%dT%H%M%SZ"

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_AMZ_DATE_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
_ONLY_V4 = "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."


@dataclass(frozen=True)
class AuthResult:
    """Who signed a request and how its body is to be checked.

    `payload_mode` is one of the `STREAMING-*` modes, ``UNSIGNED-PAYLOAD``, or ``SHA256`` (then
    `payload_sha256` holds the hex digest the body must have). `signing_key`, `seed_signature`, `amz_date`
    and `scope` let the aws-chunked decoder check chunk signatures, which chain from the request's.
    """

    access_key: str
    payload_mode: str
    payload_sha256: str | None = None
    signing_key: bytes = field(default=b"", repr=False)
    seed_signature: str = ""
    amz_date: str = ""
    scope: str = ""
    anonymous: bool = False


# -- primitives shared with the aws-chunked decoder -----------------------------------------------


@functools.lru_cache(maxsize=256)
def derive_signing_key(secret: str, date: str, region: str, service: str = SERVICE) -> bytes:
    """HMAC chain AWS4<secret> -> date -> region -> service -> aws4_request.

    Cached (as SDKs do): a key changes once a day per credential, and deriving it costs four HMACs.
    """
    key = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, TERMINATOR):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(signing_key: bytes, string_to_sign: str) -> str:
    """Hex HMAC-SHA256 of a string to sign."""
    return hmac.new(signing_key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def signatures_equal(expected: str, provided: str) -> bool:
    """Constant-time comparison of two hex signatures (case-insensitive)."""
    return hmac.compare_digest(expected.lower().encode(), provided.lower().encode("utf-8", "replace"))


def chunk_string_to_sign(amz_date: str, scope: str, previous: str, data_sha256: str) -> str:
    """String to sign of one aws-chunked chunk; the empty final chunk is signed the same way."""
    return "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, EMPTY_SHA256, data_sha256))


def trailer_string_to_sign(
    amz_date: str, scope: str, previous: str, trailers: Iterable[tuple[str, str]]
) -> str:
    """String to sign of the trailing headers: they are hashed as sorted ``name:value\\n`` lines."""
    canonical = "".join(f"{name.lower()}:{value.strip()}\n" for name, value in sorted(trailers))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return "\n".join(("AWS4-HMAC-SHA256-TRAILER", amz_date, scope, previous, digest))


def uri_encode(value: str | bytes, *, keep_slash: bool) -> str:
    """S3's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ (and / in paths) as %XX, upper-case hex."""
    return quote(value, safe="/~" if keep_slash else "-_.~")


def _utf8(value: str) -> bytes:
    # aiohttp hands over undecodable header bytes as surrogate escapes; give the signer its bytes back.
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


# -- request parts -----------------------------------------------------------------------------------


def headers_by_name(headers: Mapping[str, str]) -> dict[str, list[str]]:
    """Lower-case name -> every value, from any mapping (multidicts give repeated names)."""
    out: dict[str, list[str]] = {}
    for name, value in headers.items():
        out.setdefault(name.lower(), []).append(value)
    return out


def query_pairs(raw_query: str) -> list[tuple[str, str]]:
    """The query's (name, value) pairs in order, still percent-encoded."""
    pairs = []
    for piece in raw_query.split("&") if raw_query else []:
        name, _, value = piece.partition("=")
        pairs.append((name, value))
    return pairs


def _canonical_queries(pairs: list[tuple[str, str]]) -> list[str]:
    """The canonical query string, then the query as sent (sorted), when that differs."""
    encoded = sorted(
        (
            uri_encode(unquote_to_bytes(_utf8(k)), keep_slash=False),
            uri_encode(unquote_to_bytes(_utf8(v)), keep_slash=False),
        )
        for k, v in pairs
    )
    as_sent = sorted(pairs)
    forms = ["&".join(f"{k}={v}" for k, v in encoded), "&".join(f"{k}={v}" for k, v in as_sent)]
    return list(dict.fromkeys(forms))


def _canonical_paths(raw_path: str) -> list[str]:
    path = raw_path or "/"
    return list(dict.fromkeys([uri_encode(unquote_to_bytes(_utf8(path)), keep_slash=True), path]))


def _canonical_headers(h: dict[str, list[str]], signed: list[str]) -> str:
    lines = []
    for name in signed:
        values = h.get(name, [])
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}\n")
    return "".join(lines)


def payload_mode(value: str) -> tuple[str, str | None]:
    """The payload mode an x-amz-content-sha256 value asks for, and the digest when it is one."""
    if value in PAYLOAD_MODES:
        return value, None
    if _HEX64.fullmatch(value):
        return SHA256_PAYLOAD, value.lower()
    if value.startswith("STREAMING-AWS4-ECDSA-P256-SHA256"):
        raise errors.NotImplemented_(
            "Signature Version 4A (STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD) is not supported."
        )
    raise errors.InvalidArgument(
        "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER "
        "or a valid sha256 value.",
        ArgumentName="x-amz-content-sha256",
        ArgumentValue=value,
    )


def _parse_amz_date(value: str) -> datetime | None:
    if not _AMZ_DATE_RE.fullmatch(value):
        return None
    # YYYYMMDDTHHMMSSZ (the pattern above checked the shape); datetime() checks the ranges.
    try:
        return datetime(
            int(value[0:4]), int(value[4:6]), int(value[6:8]),
            int(value[9:11]), int(value[11:13]), int(value[13:15]), tzinfo=UTC,
        )  # fmt: skip
    except ValueError:
        return None


@dataclass(frozen=True)
class _Credential:
    access_key: str
    date: str
    region: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{SERVICE}/{TERMINATOR}"


def _parse_credential(value: str, error: type[errors.S3Error], context: str) -> _Credential:
    parts = value.split("/")
    malformed = (
        f"{context} the Credential is mal-formed; "
        'expecting "<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".'
    )
    if len(parts) < 5:
        raise error(malformed)
    access_key = "/".join(parts[:-4])
    date, region, service, terminator = parts[-4:]
    if not access_key or not re.fullmatch(r"[0-9]{8}", date) or not region or terminator != TERMINATOR:
        raise error(malformed)
    if service != SERVICE:
        raise error(f'{context} incorrect service "{service}". This endpoint belongs to "{SERVICE}".')
    return _Credential(access_key, date, region)


def _check_region(cred: _Credential, region: str | None, error: type[errors.S3Error], context: str) -> None:
    if region is not None and cred.region != region:
        raise error(f"{context} the region '{cred.region}' is wrong; expecting '{region}'", Region=region)


def _signed_header_list(value: str, error: type[errors.S3Error], context: str) -> list[str]:
    names = [n.strip().lower() for n in value.split(";")]
    if not value or any(not n for n in names):
        raise error(f"{context} SignedHeaders is empty or has an empty name.")
    return sorted(set(names))


def _require_signed(h: dict[str, list[str]], signed: list[str], extra: Iterable[str] = ()) -> None:
    """Host, the headers the scheme needs, and every x-amz-* header present must be signed."""
    wanted = {"host", *extra} | {n for n in h if n.startswith("x-amz-")}
    missing = sorted(wanted - set(signed) - {"authorization"})
    if missing:
        raise errors.AccessDenied(
            "There were headers present in the request which were not signed",
            HeadersNotSigned=", ".join(missing),
        )


def _lookup_secret(secret_for: Callable[[str], str | None], access_key: str) -> str:
    secret = secret_for(access_key)
    if secret is None:
        raise errors.InvalidAccessKeyId(AWSAccessKeyId=access_key)
    return secret


def _match(
    method: str,
    raw_path: str,
    pairs: list[tuple[str, str]],
    h: dict[str, list[str]],
    signed: list[str],
    payload_hash: str,
    key: bytes,
    amz_date: str,
    scope: str,
    provided: str,
    access_key: str,
) -> None:
    """Accept if any canonical form of the request carries the provided signature."""
    headers_block = _canonical_headers(h, signed)
    first: tuple[str, str] | None = None
    for path in _canonical_paths(raw_path):
        for query in _canonical_queries(pairs):
            canonical = "\n".join(
                (method.upper(), path, query, headers_block, ";".join(signed), payload_hash)
            )
            digest = hashlib.sha256(_utf8(canonical)).hexdigest()
            string_to_sign = "\n".join((ALGORITHM, amz_date, scope, digest))
            if first is None:
                first = (canonical, string_to_sign)
            if signatures_equal(sign(key, string_to_sign), provided):
                return
    assert first is not None
    raise errors.SignatureDoesNotMatch(
        AWSAccessKeyId=access_key,
        StringToSign=first[1],
        SignatureProvided=provided,
        CanonicalRequest=first[0],
    )


def check_one_mechanism(authorization: str | None, query_names: Iterable[str]) -> None:
    """InvalidArgument when a request carries both an Authorization header and query-string auth."""
    if authorization is not None and not {
        "X-Amz-Algorithm",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "AWSAccessKeyId",
        "Signature",
    }.isdisjoint(query_names):
        raise errors.InvalidArgument(
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
            "Signature query string parameter or the Authorization header should be specified",
            ArgumentName="Authorization",
        )


# -- the two schemes ---------------------------------------------------------------------------------


def verify(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    secret_for: Callable[[str], str | None],
    now: datetime,
    *,
    allow_anonymous: bool = False,
    max_skew: timedelta = timedelta(minutes=15),
    region: str | None = None,
) -> AuthResult:
    """Check a request's SigV4 signature (header or presigned URL) and say how to check its body.

    `raw_path` and `raw_query` are exactly as received (still percent-encoded); `headers` is any mapping
    (a multidict's repeated headers are joined with commas as SigV4 requires). `secret_for` maps an access
    key to its secret, None when unknown. Any credential-scope region is accepted unless `region` is given.
    Raises the S3 error S3 would give; returns an AuthResult.
    """
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    h = headers_by_name(headers)
    pairs = query_pairs(raw_query)
    names = {unquote(k) for k, _ in pairs}
    authorization = h.get("authorization", [None])[0]
    presigned = "X-Amz-Algorithm" in names or "X-Amz-Signature" in names or "X-Amz-Credential" in names
    check_one_mechanism(authorization, names)
    if authorization is not None:
        return _verify_header(method, raw_path, pairs, h, authorization, secret_for, now, max_skew, region)
    if presigned:
        return _verify_presigned(method, raw_path, pairs, h, secret_for, now, max_skew, region)
    if "AWSAccessKeyId" in names:
        raise errors.InvalidRequest(_ONLY_V4)
    if not allow_anonymous:
        raise errors.AccessDenied()
    mode, digest = payload_mode(h.get("x-amz-content-sha256", [UNSIGNED_PAYLOAD])[0].strip())
    if mode in SIGNED_STREAMING:
        raise errors.InvalidRequest("Signed aws-chunked payloads need a signed request.")
    return AuthResult(access_key="", payload_mode=mode, payload_sha256=digest, anonymous=True)


def _request_time(h: dict[str, list[str]]) -> tuple[str, datetime, bool]:
    """The signing timestamp (ISO basic), as a datetime, and whether it came from x-amz-date."""
    if "x-amz-date" in h:
        parsed = _parse_amz_date(h["x-amz-date"][0].strip())
        if parsed is not None:
            return parsed.strftime(AMZ_DATE), parsed, True
    elif "date" in h:
        try:
            parsed = parsedate_to_datetime(h["date"][0])
        except (TypeError, ValueError, IndexError, OverflowError):
            parsed = None
        if parsed is not None:
            parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
            return parsed.strftime(AMZ_DATE), parsed, False
    raise errors.AccessDenied("AWS authentication requires a valid Date or x-amz-date header")


def _check_skew(when: datetime, now: datetime, max_skew: timedelta) -> None:
    if abs(now - when) > max_skew:
        raise errors.RequestTimeTooSkewed(
            RequestTime=when.strftime(AMZ_DATE),
            ServerTime=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            MaxAllowedSkewMilliseconds=str(int(max_skew.total_seconds() * 1000)),
        )


def _verify_header(
    method: str,
    raw_path: str,
    pairs: list[tuple[str, str]],
    h: dict[str, list[str]],
    authorization: str,
    secret_for: Callable[[str], str | None],
    now: datetime,
    max_skew: timedelta,
    region: str | None,
) -> AuthResult:
    malformed = errors.AuthorizationHeaderMalformed
    context = "The authorization header is malformed;"
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme == "AWS" or scheme.startswith("AWS4-ECDSA"):
        raise errors.InvalidRequest(_ONLY_V4)
    if scheme != ALGORITHM:
        raise malformed(f"{context} the authorization mechanism '{scheme}' is not supported.")
    params: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, value = part.strip().partition("=")
        if eq:
            params[name.strip()] = value.strip()
    if not {"Credential", "SignedHeaders", "Signature"} <= params.keys():
        raise malformed(
            f"{context} the authorization header requires three components: "
            "Credential, SignedHeaders, and Signature."
        )
    cred = _parse_credential(params["Credential"], malformed, context)
    _check_region(cred, region, malformed, context)
    signed = _signed_header_list(params["SignedHeaders"], malformed, context)
    amz_date, when, from_amz = _request_time(h)
    if cred.date != amz_date[:8]:
        raise malformed(f"{context} Invalid credential date. Date is not the same as X-Amz-Date.")
    if "x-amz-content-sha256" not in h:
        raise errors.InvalidRequest("Missing required header for this request: x-amz-content-sha256")
    payload_hash = h["x-amz-content-sha256"][0].strip()
    mode, digest = payload_mode(payload_hash)
    _require_signed(h, signed, ["x-amz-content-sha256"] + ([] if from_amz else ["date"]))
    secret = _lookup_secret(secret_for, cred.access_key)
    _check_skew(when, now, max_skew)
    key = derive_signing_key(secret, cred.date, cred.region)
    provided = params["Signature"]
    _match(
        method, raw_path, pairs, h, signed, payload_hash, key, amz_date, cred.scope, provided, cred.access_key
    )
    return AuthResult(cred.access_key, mode, digest, key, provided.lower(), amz_date, cred.scope)


def _verify_presigned(
    method: str,
    raw_path: str,
    pairs: list[tuple[str, str]],
    h: dict[str, list[str]],
    secret_for: Callable[[str], str | None],
    now: datetime,
    max_skew: timedelta,
    region: str | None,
) -> AuthResult:
    bad = errors.AuthorizationQueryParametersError
    context = "Error parsing the X-Amz-Credential parameter;"
    q = {unquote(k): unquote(v) for k, v in pairs}
    if any(p not in q for p in (*PRESIGN_PARAMS, "X-Amz-Signature")):
        raise bad(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, "
            "X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters."
        )
    if q["X-Amz-Algorithm"] != ALGORITHM:
        raise bad('X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"')
    cred = _parse_credential(q["X-Amz-Credential"], bad, context)
    _check_region(cred, region, bad, context)
    when = _parse_amz_date(q["X-Amz-Date"])
    if when is None:
        raise bad("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"")
    if cred.date != q["X-Amz-Date"][:8]:
        raise bad(f"{context} Invalid credential date. Date is not the same as X-Amz-Date.")
    raw_expires = q["X-Amz-Expires"]
    if not re.fullmatch(r"-?[0-9]{1,12}", raw_expires):
        raise bad("X-Amz-Expires should be a number")
    expires = int(raw_expires)
    if expires < 0:
        raise bad("X-Amz-Expires must be non-negative")
    if expires > MAX_PRESIGNED_EXPIRES:
        raise bad(
            "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be "
            "less than 604800 seconds"
        )
    signed = _signed_header_list(
        q["X-Amz-SignedHeaders"], bad, "Error parsing the X-Amz-SignedHeaders parameter;"
    )
    _require_signed(h, signed)
    payload_hash = h.get("x-amz-content-sha256", [UNSIGNED_PAYLOAD])[0].strip()
    mode, digest = payload_mode(payload_hash)
    secret = _lookup_secret(secret_for, cred.access_key)
    server_time = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    # `now - when`, not `when + expires`: an X-Amz-Date in year 9999 plus its expiry is past what a
    # datetime holds.
    if now - when > timedelta(seconds=expires):
        raise errors.AccessDenied(
            "Request has expired",
            **{
                "X-Amz-Expires": raw_expires,
                "Expires": (when + timedelta(seconds=expires)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            ServerTime=server_time,
        )
    if when > now + max_skew:
        raise errors.AccessDenied("Request is not valid yet", ServerTime=server_time)
    key = derive_signing_key(secret, cred.date, cred.region)
    provided = q["X-Amz-Signature"]
    unsigned_pairs = [(k, v) for k, v in pairs if unquote(k) != "X-Amz-Signature"]
    _match(
        method, raw_path, unsigned_pairs, h, signed, payload_hash, key, q["X-Amz-Date"], cred.scope, provided,
        cred.access_key,
    )  # fmt: skip
    return AuthResult(cred.access_key, mode, digest, key, provided.lower(), q["X-Amz-Date"], cred.scope)
