// One decode step of the converted model (decodebench/convert.py):
// inputs input_ids [1, 1] int32, position [1] int32, causal_mask [1, 1, 1, context] fp16;
// output logits [1, 1, vocab] fp16; the KV cache lives in the model's MLState.
import CoreML
import Foundation

public struct LoadTimes: Sendable {
    public let coldMs: Double
    public let warmMs: Double
}

public enum HarnessError: Error, CustomStringConvertible {
    case missingPackage(String)
    case missingOutput(String)
    case badJob(String)

    public var description: String {
        switch self {
        case .missingPackage(let path): return "model package \(path) is missing or incomplete"
        case .missingOutput(let name): return "the model has no output \(name)"
        case .badJob(let reason): return "unusable job: \(reason)"
        }
    }
}

@available(iOS 18.0, macOS 15.0, *)
public struct CoreMLEngine: StepEngine {
    public let model: MLModel
    private var state: MLState
    private let context: Int
    private let inputIds: MLMultiArray
    private let position: MLMultiArray
    private let mask: MLMultiArray

    /// Compile the pushed .mlpackage on the device (cold), then load the compiled model again
    /// (warm); the second load is the one used.
    public static func load(package: URL, context: Int) async throws -> (CoreMLEngine, LoadTimes) {
        let configuration = MLModelConfiguration()
        configuration.computeUnits = .cpuAndNeuralEngine
        let coldStart = MonotonicClock.now()
        let compiled = try await MLModel.compileModel(at: package)
        _ = try await MLModel.load(contentsOf: compiled, configuration: configuration)
        let coldNs = MonotonicClock.now() - coldStart
        let warmStart = MonotonicClock.now()
        let model = try await MLModel.load(contentsOf: compiled, configuration: configuration)
        let warmNs = MonotonicClock.now() - warmStart
        let engine = try CoreMLEngine(model: model, context: context)
        return (engine, LoadTimes(coldMs: Double(coldNs) / 1e6, warmMs: Double(warmNs) / 1e6))
    }

    public init(model: MLModel, context: Int) throws {
        self.model = model
        self.context = context
        self.state = model.makeState()
        self.inputIds = try MLMultiArray(shape: [1, 1], dataType: .int32)
        self.position = try MLMultiArray(shape: [1], dataType: .int32)
        self.mask = try MLMultiArray(shape: [1, 1, 1, NSNumber(value: context)], dataType: .float16)
        fillMask()
    }

    private func fillMask() {
        mask.withUnsafeMutableBufferPointer(ofType: Float16.self) { values, _ in
            for index in values.indices { values[index] = -.infinity }
        }
    }

    public mutating func reset() throws {
        state = model.makeState()  // a fresh KV cache
        fillMask()
    }

    public mutating func step(token: Int, position at: Int) throws -> Int {
        inputIds[0] = NSNumber(value: Int32(token))
        position[0] = NSNumber(value: Int32(at))
        mask.withUnsafeMutableBufferPointer(ofType: Float16.self) { values, _ in
            values[at] = 0  // keys 0 ... at are visible
        }
        let inputs = try MLDictionaryFeatureProvider(dictionary: [
            "input_ids": MLFeatureValue(multiArray: inputIds),
            "position": MLFeatureValue(multiArray: position),
            "causal_mask": MLFeatureValue(multiArray: mask),
        ])
        let output = try model.prediction(from: inputs, using: state)
        guard let logits = output.featureValue(for: "logits")?.multiArrayValue else {
            throw HarnessError.missingOutput("logits")
        }
        return argmax(logits)
    }

    private func argmax(_ logits: MLMultiArray) -> Int {
        let vocab = logits.shape.last!.intValue
        let stride = logits.strides.last!.intValue
        return logits.withUnsafeBufferPointer(ofType: Float16.self) { values in
            var best = 0
            var bestValue = -Float16.infinity
            for index in 0..<vocab where values[index * stride] > bestValue {
                best = index
                bestValue = values[index * stride]
            }
            return best
        }
    }
}
