"""The S3 protocol, sans-IO: strings and bytes in, values or typed S3 errors (tsproxy.errors) out.

routing    which operation a request is (path-style or virtual-hosted), copy-source parsing
sigv4      Signature Version 4 verification: Authorization header and presigned URLs
chunked    aws-chunked request bodies: framing, chunk and trailer signatures, trailing checksums
checksums  the x-amz-checksum-* algorithms, computed incrementally
ranges     Range and conditional requests, S3's date formats
xml        response documents and safe parsing of the request bodies S3 takes
"""
