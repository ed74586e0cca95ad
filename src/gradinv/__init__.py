"""gradinv: gradient inversion attacks and defenses in federated learning, reproducibly."""

import time

__version__ = "0.1.0"

# When this process began its job (gradinv is the first thing a job's command imports): the
# start time of the job's MLflow run, whether it is logged at once or when the workflow ends.
STARTED = time.time()
