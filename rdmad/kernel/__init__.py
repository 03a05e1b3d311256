"""Adapters to the Linux kernel: rtnetlink, RDMA netlink, netns, udev."""
