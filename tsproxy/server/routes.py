"""The route table: every S3 operation tsproxy serves, in one place (the table is the code).

A row says which requests name the operation (their shape: method, resource, subresources, copy
source), the handler that serves it, whether it is refused while the server drains for shutdown, and
whether it may carry an ACL (only the private one is accepted). `s3.routing.route` takes the first row
whose shape a request has, so a more particular shape comes before a more general one.

While draining, an operation that would start storing new data (an object, a part, an upload) is
refused with 503, so a client retries it on another instance; one that finishes, reads or removes
what exists (CompleteMultipartUpload, AbortMultipartUpload, GET, DELETE) is served. UploadPartCopy
stores a part as UploadPart does, and is refused alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tsproxy.s3.operations import Operation
from tsproxy.s3.routing import Shape, shape
from tsproxy.server import acl, buckets, listing, multipart, object_handlers
from tsproxy.server.exchange import Handler


class Draining(Enum):
    """What an operation does while the server drains for shutdown."""

    SERVE = "serve"
    REFUSE = "refuse"  # 503 ServiceUnavailable: it would start storing something new


@dataclass(frozen=True)
class Route:
    operation: Operation
    shape: Shape
    handler: Handler
    draining: Draining = Draining.SERVE
    acl: bool = False  # may carry x-amz-acl / x-amz-grant-*: checked to be private before the handler


SERVE, REFUSE = Draining.SERVE, Draining.REFUSE
_IGNORED = frozenset({"uploadId"})  # meaningless on a bucket: S3 ignores it

ROUTES: tuple[Route, ...] = (
    # -- the service ---------------------------------------------------------------------------------
    Route(Operation.LIST_BUCKETS, shape("GET HEAD", "service"), buckets.list_buckets),
    # -- buckets -------------------------------------------------------------------------------------
    Route(Operation.GET_BUCKET_ACL, shape("GET", "bucket", "acl", ignores=_IGNORED), acl.get_bucket_acl),
    Route(
        Operation.GET_BUCKET_LOCATION,
        shape("GET", "bucket", "location", ignores=_IGNORED),
        buckets.get_bucket_location,
    ),
    Route(
        Operation.GET_BUCKET_VERSIONING,
        shape("GET", "bucket", "versioning", ignores=_IGNORED),
        buckets.get_bucket_versioning,
    ),
    Route(
        Operation.LIST_OBJECT_VERSIONS,
        shape("GET", "bucket", "versions", ignores=_IGNORED),
        listing.list_object_versions,
    ),
    Route(
        Operation.LIST_MULTIPART_UPLOADS,
        shape("GET", "bucket", "uploads", ignores=_IGNORED),
        multipart.list_multipart_uploads,
    ),
    Route(
        Operation.LIST_OBJECTS_V2,
        shape("GET", "bucket", ignores=_IGNORED, query=("list-type", "2")),
        listing.list_objects_v2,
    ),
    Route(Operation.LIST_OBJECTS, shape("GET", "bucket", ignores=_IGNORED), listing.list_objects_v1),
    Route(
        Operation.DELETE_OBJECTS,
        shape("POST", "bucket", "delete", ignores=_IGNORED),
        object_handlers.delete_objects,
    ),
    Route(Operation.PUT_BUCKET_ACL, shape("PUT", "bucket", "acl", ignores=_IGNORED), acl.put_bucket_acl),
    Route(Operation.HEAD_BUCKET, shape("HEAD", "bucket", ignores=_IGNORED), buckets.head_bucket),
    Route(Operation.CREATE_BUCKET, shape("PUT", "bucket", ignores=_IGNORED), buckets.create_bucket, acl=True),
    Route(Operation.DELETE_BUCKET, shape("DELETE", "bucket", ignores=_IGNORED), buckets.delete_bucket),
    # -- objects -------------------------------------------------------------------------------------
    Route(Operation.GET_OBJECT_ACL, shape("GET", "object", "acl"), acl.get_object_acl),
    Route(Operation.PUT_OBJECT_ACL, shape("PUT", "object", "acl"), acl.put_object_acl),
    Route(
        Operation.HEAD_OBJECT,
        shape("HEAD", "object", ignores=frozenset({"uploadId"})),
        object_handlers.head_object,
    ),
    Route(Operation.GET_OBJECT, shape("GET", "object"), object_handlers.get_object),
    Route(
        Operation.COPY_OBJECT,
        shape("PUT", "object", copy=True),
        object_handlers.copy_object,
        REFUSE,
        acl=True,
    ),
    Route(Operation.PUT_OBJECT, shape("PUT", "object"), object_handlers.put_object, REFUSE, acl=True),
    Route(Operation.DELETE_OBJECT, shape("DELETE", "object"), object_handlers.delete_object),
    # -- multipart uploads ---------------------------------------------------------------------------
    Route(
        Operation.CREATE_MULTIPART_UPLOAD,
        shape("POST", "object", "uploads"),
        multipart.create_multipart_upload,
        REFUSE,
        acl=True,
    ),
    Route(
        Operation.UPLOAD_PART_COPY,
        shape("PUT", "object", "uploadId", copy=True),
        multipart.upload_part_copy,
        REFUSE,
    ),
    Route(Operation.UPLOAD_PART, shape("PUT", "object", "uploadId"), multipart.upload_part, REFUSE),
    Route(
        Operation.COMPLETE_MULTIPART_UPLOAD,
        shape("POST", "object", "uploadId", ignores=frozenset({"uploads"})),
        multipart.complete_multipart_upload,
    ),
    Route(
        Operation.ABORT_MULTIPART_UPLOAD,
        shape("DELETE", "object", "uploadId"),
        multipart.abort_multipart_upload,
    ),
    Route(Operation.LIST_PARTS, shape("GET", "object", "uploadId"), multipart.list_parts),
)

BY_OPERATION: dict[Operation, Route] = {r.operation: r for r in ROUTES}
