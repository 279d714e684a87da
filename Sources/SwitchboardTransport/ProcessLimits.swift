#if canImport(Glibc)
import Glibc
#endif

/// Limits the operating system sets on this process.
public enum ProcessLimits {
    /// How many file descriptors the process may have open (its soft `RLIMIT_NOFILE`); nil if unknown.
    public static var openFiles: Int? {
        #if canImport(Glibc)
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return nil }
        return Int(clamping: limit.rlim_cur)
        #else
        return nil
        #endif
    }
}
