// What the harness reports about the device: memory footprint (task_info), thermal state,
// product type and OS version.
import Foundation

public enum DeviceMetrics {
    /// The process's physical footprint and its lifetime peak, in bytes (what jetsam counts).
    public static func footprint() -> (current: UInt64, peak: UInt64) {
        var info = task_vm_info_data_t()
        var count = mach_msg_type_number_t(MemoryLayout<task_vm_info_data_t>.size / MemoryLayout<integer_t>.size)
        let result = withUnsafeMutablePointer(to: &info) { pointer in
            pointer.withMemoryRebound(to: integer_t.self, capacity: Int(count)) {
                task_info(mach_task_self_, task_flavor_t(TASK_VM_INFO), $0, &count)
            }
        }
        guard result == KERN_SUCCESS else { return (0, 0) }
        return (info.phys_footprint, max(info.phys_footprint, UInt64(max(0, info.ledger_phys_footprint_peak))))
    }

    public static func thermalState() -> ThermalState {
        ThermalState(ProcessInfo.processInfo.thermalState)
    }

    /// e.g. "iPhone17,1"
    public static func productType() -> String {
        var system = utsname()
        uname(&system)
        return withUnsafeBytes(of: &system.machine) { bytes in
            String(decoding: bytes.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
    }

    public static func osVersion() -> String {
        let version = ProcessInfo.processInfo.operatingSystemVersion
        return "\(version.majorVersion).\(version.minorVersion).\(version.patchVersion)"
    }
}
