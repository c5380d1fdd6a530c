"""``python -m gpu_check [options]`` (``scripts/`` on the path): the check from a checkout,
installed or not (``scripts/source_tree.py``). (``scripts/gpu_check.sh --parity`` runs
``scripts/gpu_parity.py`` instead.)"""

import sys

import source_tree

source_tree.use()


def main(argv=None) -> int:
    from gpu_check import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
