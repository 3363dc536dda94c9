"""Settings every local (unshaped) ``hcomm train`` / ``hcomm plan`` launch of the tests shares."""
import os

# The live calibration's window per measurement (``HCOMM_CALIBRATE_S``, 0.1 s by default) made ~14 s of
# a 4-rank local launch of 28 s on the 2-core box; 0.03 s: 17 s.  These launches check losses, plans'
# validity and the trainer's reactions, not the calibrated curves (tests/parallel/test_calibration.py
# measures those with its own windows; the emulated tests keep the default).
LOCAL_LAUNCH = {"HCOMM_CALIBRATE_S": os.environ.get("HCOMM_CALIBRATE_S", "0.03")}
