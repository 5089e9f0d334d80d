"""The memory sweep as a spark-submit application.

    spark-submit [spark options] spark/sweep_job.py [--grid …] [--out …]

The options after the script are those of ``pulsar-nack sweep`` except ``--master``, which spark-submit
takes (see spark/README.md).
"""

import sys

from pulsar_nack.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
