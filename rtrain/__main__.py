"""`python -m rtrain`: the `rtrain` command, for an environment whose scripts folder is
not on PATH (or to pick the interpreter): `python -m rtrain launch ...`."""

from rtrain.cli.main import main

if __name__ == "__main__":
    main()
