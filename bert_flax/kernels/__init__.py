"""Attention kernels over packed rows that visit only the blocks a row's sequences share."""
