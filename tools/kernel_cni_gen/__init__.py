"""The kernel CNI example bundles (flannel-vxlan, calico-vxlan, aws-vpc-cni, azure-cni): see
tools/generate_kernel_cni.py."""
