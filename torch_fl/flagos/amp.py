"""What torch.autocast("flagos") may cast to."""

import torch


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]
