"""The kit's hardware profiles: one inventory group each (inventory/<profile>/,
group_vars/<profile>.yml) and one entry each in group_vars/all/speed_hardware.json."""

from __future__ import annotations

PROFILES = ("ct200", "h200", "b200", "b300")
# The GPU each profile is for, as nvidia-smi names it (group_vars/<profile>.yml kimi_gpu_model).
GPU_MODEL = {
    "ct200": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "b300": "NVIDIA B300",
}
# The part of a GPU's name that tells its profile: other editions of a GPU (an H200 NVL, an RTX
# PRO 6000 Workstation Edition) belong to the same profile.
GPU_MARKER = {"ct200": "RTX PRO 6000", "h200": "H200", "b200": "B200", "b300": "B300"}
# (marker, profile), for results whose provenance names the GPU but not the profile.
PROFILE_OF_GPU = tuple((GPU_MARKER[profile], profile) for profile in PROFILES)
