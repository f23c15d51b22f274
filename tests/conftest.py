"Pytest markers shared by the test suite: `slow` and `model` (loads the real Gemma 3 270M)."

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "model: loads the real default model (Gemma 3 270M, converted on first use)")
