// The JSON the harness reads and writes. Field names are the Python schema's
// (decodebench/harness.py, decodebench/contracts/results.py);
// tests/ios_harness/test_swift_schema.py checks every CodingKeys raw value below against the
// pydantic JSON schema.
import Foundation

public enum ThermalState: String, Codable, Sendable {
    case nominal, fair, serious, critical, unknown

    public init(_ state: ProcessInfo.ThermalState) {
        switch state {
        case .nominal: self = .nominal
        case .fair: self = .fair
        case .serious: self = .serious
        case .critical: self = .critical
        @unknown default: self = .unknown
        }
    }
}

/// decodebench.contracts.domain.Attention: how the build lays out grouped-query attention.
public enum Attention: String, Codable, Sendable {
    case repeat_kv, folded
}

/// decodebench.contracts.domain.KVCache: where the KV cache lives.
public enum KVCache: String, Codable, Sendable {
    case state, input
}

/// decodebench.harness.FailureReason: why a done marker says ok: false.
public enum FailureReason: String, Codable, Sendable {
    case interrupted, missing_job, bad_job, protocol_version, missing_package, model_error
}

public enum HarnessProtocol {
    /// decodebench.harness.HARNESS_PROTOCOL_VERSION; also Info.plist's DecodebenchHarnessProtocol.
    public static let version = 1
    public static let defaultThermalWaitS = 60.0
    public static let maxThermalWaitS = 600.0
    /// Set by the agent at launch: which run a missing or unreadable job.json belonged to.
    public static let runIdEnvironment = "DECODEBENCH_RUN_ID"
}

/// The variant the job's package was built as (decodebench.contracts.domain.VariantSpec, the keys
/// read).
public struct VariantSpec: Codable, Sendable {
    public let attention: Attention?
    public let kv: KVCache?
    public let context: Int?

    enum CodingKeys: String, CodingKey {
        case attention
        case kv
        case context
    }
}

/// Documents/job.json, pushed by the agent.
public struct HarnessJob: Codable, Sendable {
    public let protocolVersion: Int
    public let runId: Int
    public let model: String
    public let variantLabel: String
    public let deviceClass: String
    public let deviceUdid: String
    public let driver: String
    public let artifactSha256: String
    public let packagePath: String
    /// The model format and runtime: coreml or coreai (EngineKind); absent means coreml.
    public let engine: String?
    /// Core AI's compute-unit preference (ComputeUnits); absent means default. Read ahead of
    /// decodebench/harness.py, which does not write it yet.
    public let computeUnits: String?
    public let bytesPerToken: Int
    public let contextTokens: Int
    public let decodeTokens: Int
    public let warmupSteps: Int
    public let thermalWaitS: Double?
    public let promptSetVersion: String
    public let variant: VariantSpec?
    public let prompts: [HarnessPrompt]

    enum CodingKeys: String, CodingKey {
        case protocolVersion = "protocol_version"
        case runId = "run_id"
        case model
        case variantLabel = "variant_label"
        case deviceClass = "device_class"
        case deviceUdid = "device_udid"
        case driver
        case artifactSha256 = "artifact_sha256"
        case packagePath = "package_path"
        case engine
        case computeUnits = "compute_units"
        case bytesPerToken = "bytes_per_token"
        case contextTokens = "context_tokens"
        case decodeTokens = "decode_tokens"
        case warmupSteps = "warmup_steps"
        case thermalWaitS = "thermal_wait_s"
        case promptSetVersion = "prompt_set_version"
        case variant
        case prompts
    }
}

public struct HarnessPrompt: Codable, Sendable {
    public let index: Int
    public let tokenIds: [Int]

    enum CodingKeys: String, CodingKey {
        case index
        case tokenIds = "token_ids"
    }
}

/// One prompt of the sweep (decodebench.contracts.results.PromptResult).
public struct PromptResult: Codable, Sendable {
    public var promptIndex: Int
    public var promptTokens: Int
    public var generatedTokens: Int
    public var ttftMs: Double
    public var prefillTokS: Double
    public var decodeTokS: Double
    public var tokenLatenciesMs: [Double]
    public var tokenIds: [Int]?

    enum CodingKeys: String, CodingKey {
        case promptIndex = "prompt_index"
        case promptTokens = "prompt_tokens"
        case generatedTokens = "generated_tokens"
        case ttftMs = "ttft_ms"
        case prefillTokS = "prefill_tok_s"
        case decodeTokS = "decode_tok_s"
        case tokenLatenciesMs = "token_latencies_ms"
        case tokenIds = "token_ids"
    }
}

/// Documents/results.json (decodebench.contracts.results.RunResult).
public struct RunResult: Codable, Sendable {
    public var protocolVersion: Int = HarnessProtocol.version
    public var deviceUdid: String
    public var deviceClass: String
    public var productType: String
    public var osVersion: String
    public var driver: String
    public var simulated: Bool = false
    public var loadTimeColdMs: Double
    public var loadTimeWarmMs: Double
    /// Largest phys_footprint sampled after every step of the timed prompts (decode memory).
    public var peakMemoryBytes: Int
    /// Lifetime footprint peak when compilation and both loads are done.
    public var compilePeakMemoryBytes: Int?
    public var lowPowerMode: Bool?
    public var thermalWaitMs: Double?
    /// Sampled right after each prompt, in prompt order.
    public var promptThermalStates: [ThermalState]?
    public var thermalStateStart: ThermalState
    public var thermalStateEnd: ThermalState
    public var timingModel: String = ""
    public var prompts: [PromptResult]

    enum CodingKeys: String, CodingKey {
        case protocolVersion = "protocol_version"
        case deviceUdid = "device_udid"
        case deviceClass = "device_class"
        case productType = "product_type"
        case osVersion = "os_version"
        case driver
        case simulated
        case loadTimeColdMs = "load_time_cold_ms"
        case loadTimeWarmMs = "load_time_warm_ms"
        case peakMemoryBytes = "peak_memory_bytes"
        case compilePeakMemoryBytes = "compile_peak_memory_bytes"
        case lowPowerMode = "low_power_mode"
        case thermalWaitMs = "thermal_wait_ms"
        case promptThermalStates = "prompt_thermal_states"
        case thermalStateStart = "thermal_state_start"
        case thermalStateEnd = "thermal_state_end"
        case timingModel = "timing_model"
        case prompts
    }
}

/// Documents/done: written after results.json, or instead of it when the run failed.
public struct DoneMarker: Codable, Sendable {
    public var runId: Int
    public var ok: Bool
    public var resultsSha256: String?
    public var error: String?
    public var reason: FailureReason?
    public var protocolVersion: Int = HarnessProtocol.version

    enum CodingKeys: String, CodingKey {
        case runId = "run_id"
        case ok
        case resultsSha256 = "results_sha256"
        case error
        case reason
        case protocolVersion = "protocol_version"
    }
}

public enum HarnessFiles {
    public static let job = "job.json"
    public static let results = "results.json"
    public static let done = "done"
    public static let log = "harness.log"
    public static let partialSuffix = ".partial"
    public static let completeMarker = "complete"
}
