"""What the tests share: configs, the one-device reference and its floor, the command line, runs,
files, a token corpus and a Llama-style model. Fixtures stay in ``tests/conftest.py``."""
