"""The hostile-input suite: what agentcell promises when its input comes from someone who wants to break it.

Each module covers one theme (tools, configuration, the store, the HTTP server), and each test's docstring
states one promise in a line. A newcomer can read the docstrings top to bottom as the list of guarantees.
"""
