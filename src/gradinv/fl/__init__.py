"""The federated protocol in motion: clients computing defended updates, a server aggregating.

``client.py`` is one client's round, ``server.py`` the aggregation and the training loop,
``official.py`` CENSOR's code's central training loop. The honest-but-curious server's record of
one victim's update is the capture stage (:mod:`gradinv.stages.capture`).
"""
