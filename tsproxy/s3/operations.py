"""The S3 operations tsproxy serves: one enum that routing, handlers, metrics and logs all share."""

from __future__ import annotations

from enum import StrEnum


class Operation(StrEnum):
    """An S3 API operation, by the name AWS gives it (the value is that name, so it is a metric label)."""

    LIST_BUCKETS = "ListBuckets"
    CREATE_BUCKET = "CreateBucket"
    HEAD_BUCKET = "HeadBucket"
    DELETE_BUCKET = "DeleteBucket"
    GET_BUCKET_LOCATION = "GetBucketLocation"
    GET_BUCKET_VERSIONING = "GetBucketVersioning"
    GET_BUCKET_ACL = "GetBucketAcl"
    PUT_BUCKET_ACL = "PutBucketAcl"
    LIST_OBJECT_VERSIONS = "ListObjectVersions"
    LIST_OBJECTS_V2 = "ListObjectsV2"
    LIST_OBJECTS = "ListObjects"
    HEAD_OBJECT = "HeadObject"
    GET_OBJECT = "GetObject"
    PUT_OBJECT = "PutObject"
    COPY_OBJECT = "CopyObject"
    DELETE_OBJECT = "DeleteObject"
    DELETE_OBJECTS = "DeleteObjects"
    GET_OBJECT_ACL = "GetObjectAcl"
    PUT_OBJECT_ACL = "PutObjectAcl"
    CREATE_MULTIPART_UPLOAD = "CreateMultipartUpload"
    UPLOAD_PART = "UploadPart"
    UPLOAD_PART_COPY = "UploadPartCopy"
    COMPLETE_MULTIPART_UPLOAD = "CompleteMultipartUpload"
    ABORT_MULTIPART_UPLOAD = "AbortMultipartUpload"
    LIST_PARTS = "ListParts"
    LIST_MULTIPART_UPLOADS = "ListMultipartUploads"
    UNKNOWN = "Unknown"
