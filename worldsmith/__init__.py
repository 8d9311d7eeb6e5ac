"""worldsmith: manufacture executable tool-use worlds for LLM agents and train agents in them.

Package `__init__` modules stay import-light: the sandbox worker imports parts of this
package in an interpreter without site-packages.
"""

__version__ = "0.1.0"
