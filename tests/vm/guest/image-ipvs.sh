#!/bin/bash
# The container image's root filesystem (`podman export` of the image
# tests/image.rs built, at /image.tar) running IPVS mode in the VM: the
# daemon is the image's binary, chrooted into the image, so it runs the
# image's iptables (through its backend wrapper), ipset and modprobe, with
# what the DaemonSet mounts from the node (/lib/modules, /run for the
# xtables lock) and the node's /proc, /sys and /dev, as a privileged
# container sees them. ipvs-scenarios.sh (at /ipvs-scenarios.sh) runs the
# scenarios named in KPR_SCENARIOS against it.
set -eu
R=/image
mkdir -p "$R"
tar -C "$R" -xf /image.tar
rm /image.tar
for d in proc sys dev run lib/modules tmp; do
  mkdir -p "$R/$d" "/$d"
  mount -o bind "/$d" "$R/$d"
done
cat >/usr/local/bin/kube-proxy-rs-in-image <<EOS
#!/bin/sh
exec chroot $R /usr/local/bin/kube-proxy-rs "\$@"
EOS
chmod +x /usr/local/bin/kube-proxy-rs-in-image
echo "image: $(chroot "$R" /usr/local/bin/kube-proxy-rs --version 2>&1 | head -1); iptables alternatives: $(readlink "$R/etc/alternatives/iptables")"
rc=0
KPR_BIN=/usr/local/bin/kube-proxy-rs-in-image bash /ipvs-scenarios.sh || rc=$?
echo "image: the wrapper chose $(readlink "$R/etc/alternatives/iptables")"
exit $rc
