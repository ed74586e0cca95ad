"""The federated protocol in motion: clients computing defended updates, a server aggregating.

``client.py`` is one client's round, ``server.py`` the aggregation and the training loop, and
``capture.py`` the honest-but-curious server's record of one victim's update.
"""
