# Sourced by build_here.sh and check_image.sh: where their images live (vfs: no overlay mounts
# needed, each layer a full copy, so keep BUILD_HERE_STORE on a disk with tens of GB free).
STORE=${BUILD_HERE_STORE:-/var/lib/clustered-asr-build}
STORAGE_FLAGS="--storage-driver vfs --root $STORE/storage --runroot $STORE/run"
