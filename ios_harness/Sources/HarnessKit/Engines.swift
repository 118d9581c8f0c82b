// What every step engine shares: the job's engine (its model format: coreml opens an
// .mlpackage with Core ML, coreai an .aimodel with Core AI), the compute-unit preference a
// Core AI job may name, the load times an engine reports, and the harness's errors.
// The engines themselves are CoreMLEngine.swift and CoreAIEngine.swift (the latter only where
// the SDK has Core AI); Harness.swift picks one by the job's engine.
import Foundation

/// decodebench.harness.HarnessJob.engine: the model format, and so the runtime that decodes it.
public enum EngineKind: String, CaseIterable, Sendable {
    case coreml, coreai

    /// How the package's name ends (decodebench.contracts.names.ARTIFACT_NAMES).
    public var packageSuffix: String {
        switch self {
        case .coreml: return ".mlpackage"
        case .coreai: return ".aimodel"
        }
    }

    /// The job's engine (absent means coreml, as in harness.py), or an error naming it.
    public static func named(_ name: String?) throws -> EngineKind {
        let name = name ?? EngineKind.coreml.rawValue
        guard let kind = EngineKind(rawValue: name) else {
            let known = EngineKind.allCases.map(\.rawValue).joined(separator: " or ")
            throw HarnessError.badJob("job.json asks for engine \(name); the harness decodes with \(known)")
        }
        return kind
    }
}

/// The job's optional compute_units: which compute unit Core AI's specialization prefers.
/// `default` lets Core AI choose (SpecializationOptions.default); `cpu` keeps it on the CPU.
/// The Core ML engine always runs `.cpuAndNeuralEngine` and accepts only `default`.
public enum ComputeUnits: String, CaseIterable, Sendable {
    case `default`, neural_engine, gpu, cpu

    public static func named(_ name: String?) throws -> ComputeUnits {
        let name = name ?? ComputeUnits.default.rawValue
        guard let units = ComputeUnits(rawValue: name) else {
            let known = ComputeUnits.allCases.map(\.rawValue).joined(separator: ", ")
            throw HarnessError.badJob("job.json asks for compute_units \(name); the harness knows \(known)")
        }
        return units
    }
}

/// Why the job's engine, compute units or package name cannot run, or nil.
public func engineProblem(_ job: HarnessJob) -> String? {
    do {
        let engine = try EngineKind.named(job.engine)
        let units = try ComputeUnits.named(job.computeUnits)
        if engine == .coreml, units != .default {
            return "compute_units \(units.rawValue) is a Core AI preference; the coreml engine runs on the CPU and Neural Engine (leave compute_units default)"
        }
        if !job.packagePath.hasSuffix(engine.packageSuffix) {
            return "engine \(engine.rawValue) opens a \(engine.packageSuffix) package, the job names \(job.packagePath)"
        }
        return nil
    } catch let error as HarnessError {
        if case .badJob(let reason) = error { return reason }
        return error.description
    } catch {
        return "\(error)"
    }
}

public struct LoadTimes: Sendable {
    public let coldMs: Double
    public let warmMs: Double
}

public enum HarnessError: Error, CustomStringConvertible {
    case missingJob(String)
    case badJob(String)
    case protocolMismatch(String)
    case missingPackage(String)
    case model(String)
    case interrupted(String)

    public var description: String {
        switch self {
        case .missingJob(let name): return "no \(name) in Documents: nothing to run"
        case .badJob(let reason): return "unusable job: \(reason)"
        case .protocolMismatch(let reason): return reason
        case .missingPackage(let path): return "model package \(path) is missing or incomplete"
        case .model(let reason): return reason
        case .interrupted(let reason): return "interrupted: \(reason); the run is abandoned"
        }
    }

    /// decodebench.harness.FailureReason of this error.
    public var reason: FailureReason {
        switch self {
        case .missingJob: return .missing_job
        case .badJob: return .bad_job
        case .protocolMismatch: return .protocol_version
        case .missingPackage: return .missing_package
        case .model: return .model_error
        case .interrupted: return .interrupted
        }
    }
}

/// The largest of `count` logits read by `value`, and the first non-finite one if any: a scan
/// that never throws, so it can run inside a runtime's buffer closure (Core ML's or Core AI's);
/// `checked` turns it into the greedy token or an error naming the step (never a silent 0).
public struct GreedyScan: Sendable {
    public let count: Int
    public private(set) var best = 0
    public private(set) var nonFinite: (index: Int, value: Float)?

    public init(count: Int, value: (Int) -> Float) {
        self.count = count
        var bestValue = -Float.infinity
        for index in 0..<max(count, 0) {
            let candidate = value(index)
            guard candidate.isFinite else {
                nonFinite = (index, candidate)
                return
            }
            if candidate > bestValue {
                best = index
                bestValue = candidate
            }
        }
    }

    public func checked(position: Int) throws -> Int {
        guard count > 0 else { throw HarnessError.model("logits at position \(position) are empty") }
        if let bad = nonFinite {
            throw HarnessError.model("logit \(bad.index) at position \(position) is \(bad.value): the model produced a non-finite value")
        }
        return best
    }
}
