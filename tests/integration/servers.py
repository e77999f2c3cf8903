"""What the loopback test server is started with (the fixtures are in conftest.py)."""

TEST_MODEL = "smollm2-135m-instruct"
API_KEY = "sk-hybridllm-test"
ALIAS = "smol"
