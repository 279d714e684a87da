import CLibUV

/// Process-wide allocator tuning for a server that moves large messages.
public enum MallocTuning {
    /// Makes glibc's malloc keep freed blocks of up to 32 MiB for reuse. By default it maps each block
    /// over 128 KiB from the kernel and unmaps it on free, so a server relaying 64 KiB messages pays a
    /// page fault for every page of every buffer (measured: 2.3× the CPU per call of rpc 4×16×64 KiB).
    /// Memory freed at the top of the heap goes back to the kernel only beyond 128 MiB. Call once, early;
    /// a no-op where the C library is not glibc.
    public static func keepLargeBlocks() {
        #if os(Linux) && canImport(Glibc)
        _ = mallopt(M_MMAP_THRESHOLD, 32 << 20)
        _ = mallopt(M_TRIM_THRESHOLD, 128 << 20)
        #endif
    }

    /// Gives free memory back to the kernel from every malloc arena (glibc's `malloc_trim`). A server
    /// calls it after freeing a lot at once (such as many slow consumers' buffers): freed blocks scattered
    /// through a thread's arena are otherwise kept for good. Costs a walk of the free lists; a no-op
    /// where the C library is not glibc.
    public static func releaseFreeMemory() {
        #if os(Linux) && canImport(Glibc)
        _ = malloc_trim(0)
        #endif
    }
}
