"""Attention kernels for packed rows that skip the blocks no two tokens of one sequence share."""
