"""Multipart uploads, as one package: each client part a segment of its own until completion.

Words used throughout: an upload is *straight* when its parts go straight into a backend multipart
upload at the object's own key, begun with the client's upload (a backend with multipart uploads makes
every new upload straight); a part *sent straight* is one that went there as the backend part of the
same number (its record names the backend part's ETag), while a part *kept aside* waits for the
completion in its record (small) or as an object of its own (see `multipart`).

- `ids`: what a client upload id is made of (token, backend upload, ticket) and the upload's name;
- `tickets`: what CreateMultipartUpload decided, carried in the upload id (pure);
- `layout`: every key of the reserved namespace, spelt once;
- `records`: an upload's state, its part records, a completion's answer (what is stored);
- `pending`: what this instance holds of an upload, and the upload's lifecycle as a state table;
- `keeper`: an upload's state and part records, held and written late, read back;
- `completion`: completing a straight upload in place;
- `multipart`: the uploads part of the service (create, take parts, complete, abort, list).
"""
