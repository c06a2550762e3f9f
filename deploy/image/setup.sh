#!/bin/sh
# Finishes the image's root filesystem, run as root inside it once its
# packages (deploy/image/packages) are installed and deploy/iptables-wrapper
# is at /usr/sbin/iptables-wrapper: by deploy/image/build.sh (mmdebstrap's
# customize hook, in a chroot) and by deploy/Dockerfile (RUN). One recipe
# for both.
set -eu

# iptables, iptables-save, iptables-restore and the ip6tables ones go
# through the wrapper until it has picked the node's backend (legacy or
# nft), as in upstream's kube-proxy image.
chmod 0755 /usr/sbin/iptables-wrapper
for cmd in iptables ip6tables; do
    update-alternatives --quiet --install "/usr/sbin/$cmd" "$cmd" /usr/sbin/iptables-wrapper 100 \
        --slave "/usr/sbin/$cmd-restore" "$cmd-restore" /usr/sbin/iptables-wrapper \
        --slave "/usr/sbin/$cmd-save" "$cmd-save" /usr/sbin/iptables-wrapper
    # In case a backend was chosen by hand before: back to the wrapper.
    update-alternatives --quiet --set "$cmd" /usr/sbin/iptables-wrapper
done

# No package manager caches, logs or backups: nothing the daemon reads.
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old \
    /var/lib/dpkg/*-old /var/log/*
