"""spark-submit entry of the export:

    spark-submit --master spark://host:7077 tsproxy/spark/export_main.py \
        --endpoint http://tsproxy:9000 --bucket tiered --topics orders --output /archive

Takes the flags of `tsproxy export` except --master (spark-submit sets it). Every node needs tsproxy
installed in the Python that runs the workers (or shipped with --py-files).
"""

from __future__ import annotations

import sys

from tsproxy.spark.cli import submit_main

if __name__ == "__main__":
    sys.exit(submit_main(sys.argv[1:]))
