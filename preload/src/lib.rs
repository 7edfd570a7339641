//! liblockstep.so (work in progress).
