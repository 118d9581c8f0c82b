"""decodebench: measure and explain Core ML LLM decode speed on iPhones."""

__version__ = "0.1.0"
