// The Core AI step engine (iOS 27): the decode step of a pushed `.aimodel`
// (decodebench/formats/coreai/convert.py), with the Core ML kv=input build's names:
// inputs input_ids [1, 1] int32, position int32, causal_mask [1, 1, 1, context] fp16 and
// key_cache_i/value_cache_i [1, Hkv, context, head_dim] fp16; outputs logits [1, 1, vocab] and
// the new token's key_i/value_i [1, Hkv, 1, head_dim], which the engine writes into its cache at
// `position` (as CoreMLEngine's kv=input path and decodebench/modeling/host.py's HostCache do).
// Mask slots 0..<position are visible; the new token is attended inside the graph. A Core AI
// build keeps no KV states yet (convert.check_variant), so an asset with states is refused.
//
// Loading: AIModel(contentsOf:options:) specializes the asset for this phone and stores the
// result in AIModelCache.default; the cold load is that specialization plus loading the `main`
// function (the function owns the weights), after every cached specialization of the asset was
// deleted; the warm load takes the specialization from the cache and loads `main` again. The
// SpecializationOptions come from the job's compute_units.
//
// All of it is behind `#if canImport(CoreAI)`: an SDK without Core AI compiles none of it, and
// Harness.swift then fails a coreai job with a model_error that says so.
#if canImport(CoreAI)
import CoreAI
import Foundation

@available(iOS 27.0, macOS 27.0, *)
public struct CoreAIEngine: StepEngine {
    /// The decode step's function in the asset (convert.py names it `main`).
    public static let functionName = "main"

    private let function: InferenceFunction
    private let context: Int
    private var inputIds: NDArray
    private var position: NDArray
    private var mask: NDArray
    /// (cache input name, new K/V output name, the cache array), keys and values by layer.
    private var caches: [(input: String, output: String, array: NDArray)]

    /// Time the cold load against the cached one (see the file's header); the cached one is used.
    public static func load(package: URL, context: Int, kv: KVCache?, units: ComputeUnits) async throws -> (CoreAIEngine, LoadTimes) {
        if let kv = kv, kv != .input {
            throw HarnessError.badJob("the job says kv=\(kv.rawValue); a Core AI build keeps its cache as inputs (kv=input)")
        }
        let options = specialization(units)
        try forgetSpecializations(of: package, options: options)
        let coldStart = MonotonicClock.now()
        try await specializeAndLoad(package, options: options)
        let coldNs = MonotonicClock.now() - coldStart
        let warmStart = MonotonicClock.now()
        let function = try decodeFunction(of: try cachedModel(package, options: options))
        let warmNs = MonotonicClock.now() - warmStart
        let engine = try CoreAIEngine(function: function, context: context)
        return (engine, LoadTimes(coldMs: Double(coldNs) / 1e6, warmMs: Double(warmNs) / 1e6))
    }

    /// The job's compute_units as Core AI's specialization options: a preferred compute unit
    /// (Core AI still falls back to the others for what the preferred one cannot run), or the
    /// CPU alone.
    static func specialization(_ units: ComputeUnits) -> SpecializationOptions {
        switch units {
        case .default: return .default
        case .neural_engine: return SpecializationOptions(preferredComputeUnitKind: .neuralEngine)
        case .gpu: return SpecializationOptions(preferredComputeUnitKind: .gpu)
        case .cpu: return .cpuOnly
        }
    }

    /// Delete what Core AI cached for `package` (after a run: a specialization is a device copy
    /// of the weights). Best effort: an entry an AIModel still holds cannot be deleted yet.
    public static func forget(_ package: URL) {
        try? AIModelCache.default.deleteEntries(for: package)
    }

    /// Before the cold load nothing of `package` may be cached, or the cold load would be a
    /// cached one. Assumes deleteEntries(for:) may throw when there is nothing to delete (the
    /// reference does not say), so the cache is asked afterwards instead.
    static func forgetSpecializations(of package: URL, options: SpecializationOptions) throws {
        forget(package)
        if (try? AIModelCache.default.model(for: package, options: options)) != nil {
            throw HarnessError.model("a specialization of \(package.lastPathComponent) stays in Core AI's cache: the cold load cannot be timed")
        }
    }

    /// The cold load: specialize (storing the result in the default cache) and load `main`;
    /// both are released before the cached load is timed.
    static func specializeAndLoad(_ package: URL, options: SpecializationOptions) async throws {
        let model: AIModel
        do {
            model = try await AIModel(contentsOf: package, options: options)
        } catch {
            throw HarnessError.model("Core AI could not specialize \(package.lastPathComponent) for this phone: \(error)")
        }
        _ = try decodeFunction(of: model)
    }

    static func cachedModel(_ package: URL, options: SpecializationOptions) throws -> AIModel {
        let cached: AIModel?
        do {
            cached = try AIModelCache.default.model(for: package, options: options)
        } catch {
            throw HarnessError.model("Core AI's cached specialization of \(package.lastPathComponent) does not load: \(error)")
        }
        guard let model = cached else {
            throw HarnessError.model("Core AI kept no specialization of \(package.lastPathComponent) after the cold load: the cached load cannot be timed")
        }
        return model
    }

    static func decodeFunction(of model: AIModel) throws -> InferenceFunction {
        let loaded: InferenceFunction?
        do {
            loaded = try model.loadFunction(named: functionName)
        } catch {
            throw HarnessError.model("Core AI could not load function \(functionName): \(error)")
        }
        guard let function = loaded else {
            throw HarnessError.model("the asset has no function \(functionName) (it has \(model.functionNames.joined(separator: ", ")))")
        }
        return function
    }

    init(function: InferenceFunction, context: Int) throws {
        let signature = function.descriptor
        guard signature.stateNames.isEmpty else {
            throw HarnessError.model("function \(Self.functionName) keeps states \(signature.stateNames); the harness drives Core AI builds with kv=input only")
        }
        guard signature.outputNames.contains("logits") else {
            throw HarnessError.model("function \(Self.functionName) has no output logits")
        }
        self.function = function
        self.context = context
        let one: ([Int]) -> Bool = { $0.reduce(1, *) == 1 }
        inputIds = try CoreAIArrays.input("input_ids", of: signature, .int32, "one int32", fits: one)
        position = try CoreAIArrays.input("position", of: signature, .int32, "one int32", fits: one)
        mask = try CoreAIArrays.input("causal_mask", of: signature, .float16, "[1, 1, 1, \(context)] fp16") {
            $0.count == 4 && $0[3] == context
        }
        caches = try Self.cacheInputs(signature, context: context)
        clear()
    }

    /// key_cache_0, value_cache_0, key_cache_1, ... while they exist, each with its output.
    static func cacheInputs(_ signature: InferenceFunctionDescriptor, context: Int) throws -> [(input: String, output: String, array: NDArray)] {
        var caches: [(input: String, output: String, array: NDArray)] = []
        var layer = 0
        while signature.inputNames.contains("key_cache_\(layer)") {
            for (input, output) in [("key_cache_\(layer)", "key_\(layer)"), ("value_cache_\(layer)", "value_\(layer)")] {
                guard signature.outputNames.contains(output) else {
                    throw HarnessError.model("function \(functionName) has no output \(output) for cache \(input)")
                }
                let array = try CoreAIArrays.input(input, of: signature, .float16, "a [1, Hkv, \(context), head_dim] fp16 cache") {
                    $0.count == 4 && $0[2] == context
                }
                caches.append((input: input, output: output, array: array))
            }
            layer += 1
        }
        if caches.isEmpty { throw HarnessError.model("function \(functionName) has no key_cache_0 input") }
        return caches
    }

    /// A fresh KV cache: zeroed cache arrays, every slot masked.
    private mutating func clear() {
        CoreAIArrays.fill(&mask, with: -Float16.infinity)
        for index in caches.indices {
            CoreAIArrays.fill(&caches[index].array, with: Float16(0))
        }
    }

    public mutating func reset() throws {
        clear()
    }

    public mutating func step(token: Int, position at: Int) async throws -> Int {
        guard (0..<context).contains(at) else { throw HarnessError.model("position \(at) is outside the context of \(context)") }
        CoreAIArrays.setFirst(&inputIds, to: Int32(token))
        CoreAIArrays.setFirst(&position, to: Int32(at))
        var outputs = try await run(at: at)
        guard let logits = outputs.remove("logits")?.ndArray else {
            throw HarnessError.model("function \(Self.functionName) returned no logits array at position \(at)")
        }
        for index in caches.indices {
            let name = caches[index].output
            guard let new = outputs.remove(name)?.ndArray else {
                throw HarnessError.model("function \(Self.functionName) returned no \(name) array at position \(at)")
            }
            try CoreAIArrays.write(new, into: &caches[index].array, at: at, name: name)
        }
        CoreAIArrays.setVisible(&mask, slot: at)  // the next step sees this token in the cache
        return try CoreAIArrays.argmax(logits, position: at)
    }

    /// One call of `main`. The feeds are built and dropped here, before the caches are written,
    /// so no second reference to a cache array is alive when it is mutated.
    private func run(at: Int) async throws -> InferenceFunction.Outputs {
        var feeds: [String: NDArray] = ["input_ids": inputIds, "position": position, "causal_mask": mask]
        for cache in caches { feeds[cache.input] = cache.array }
        do {
            return try await function.run(inputs: feeds)
        } catch {
            throw HarnessError.model("Core AI's \(Self.functionName) failed at position \(at): \(error)")
        }
    }
}

/// Reading and writing Core AI arrays, kept in one place. Documented: NDArray(descriptor:)
/// allocation from an input's descriptor, `view(as:)` / `mutableView(as:)`, `shape`,
/// `scalarType`. Assumed from Apple's coreai-models samples (not in the reference pages read):
/// the views' `withUnsafePointer` / `withUnsafeMutablePointer` closures, which hand over the
/// element pointer with the shape and strides (in elements, possibly padded) as `Span<Int>`,
/// and `.ndArray` of an input descriptor and of an output value.
@available(iOS 27.0, macOS 27.0, *)
enum CoreAIArrays {
    /// A host array for input `name`, after checking its scalar type and shape.
    static func input(
        _ name: String, of signature: InferenceFunctionDescriptor, _ scalarType: NDArray.ScalarType,
        _ expected: String, fits: ([Int]) -> Bool
    ) throws -> NDArray {
        guard case .ndArray(let descriptor) = signature.inputDescriptor(of: name) else {
            throw HarnessError.model("function \(CoreAIEngine.functionName) has no array input \(name)")
        }
        guard descriptor.scalarType == scalarType, !descriptor.shape.contains(where: { $0 < 0 }), fits(descriptor.shape) else {
            throw HarnessError.model("input \(name) is \(descriptor.shape) \(descriptor.scalarType), expected \(expected)")
        }
        return NDArray(descriptor: descriptor)
    }

    static func ints(_ span: Span<Int>) -> [Int] {
        var values: [Int] = []
        for index in 0..<span.count { values.append(span[index]) }
        return values
    }

    /// Call `body` with every element offset of an array of `shape` laid out with `strides`.
    static func forEachOffset(shape: [Int], strides: [Int], _ body: (Int) -> Void) {
        if shape.contains(0) { return }
        var index = [Int](repeating: 0, count: shape.count)
        while true {
            var offset = 0
            for axis in 0..<shape.count { offset += index[axis] * strides[axis] }
            body(offset)
            var axis = shape.count - 1
            while axis >= 0 {
                index[axis] += 1
                if index[axis] < shape[axis] { break }
                index[axis] = 0
                axis -= 1
            }
            if axis < 0 { return }
        }
    }

    static func fill<T: BitwiseCopyable>(_ array: inout NDArray, with value: T) {
        let view = array.mutableView(as: T.self)
        view.withUnsafeMutablePointer { pointer, shape, strides in
            forEachOffset(shape: ints(shape), strides: ints(strides)) { pointer[$0] = value }
        }
    }

    /// The first element of a one-element array (input_ids, position).
    static func setFirst(_ array: inout NDArray, to value: Int32) {
        let view = array.mutableView(as: Int32.self)
        view.withUnsafeMutablePointer { pointer, _, _ in pointer[0] = value }
    }

    /// Unmask key slot `slot` of causal_mask [1, 1, 1, context].
    static func setVisible(_ mask: inout NDArray, slot: Int) {
        let view = mask.mutableView(as: Float16.self)
        view.withUnsafeMutablePointer { pointer, _, strides in pointer[slot * strides[3]] = 0 }
    }

    /// Greedy choice over the last axis of fp16 or fp32 logits [1, 1, vocab].
    static func argmax(_ logits: NDArray, position: Int) throws -> Int {
        switch logits.scalarType {
        case .float16: return try scan(logits, as: Float16.self).checked(position: position)
        case .float32: return try scan(logits, as: Float.self).checked(position: position)
        default: throw HarnessError.model("logits have scalar type \(logits.scalarType), expected float16 or float32")
        }
    }

    static func scan<T: BinaryFloatingPoint & BitwiseCopyable>(_ logits: NDArray, as type: T.Type) -> GreedyScan {
        logits.view(as: T.self).withUnsafePointer { pointer, shape, strides in
            let vocab = shape[shape.count - 1]
            let stride = strides[strides.count - 1]
            return GreedyScan(count: vocab) { Float(pointer[$0 * stride]) }
        }
    }

    /// Copy the step's new K or V [1, Hkv, 1, head_dim] into the cache [1, Hkv, context,
    /// head_dim] at `position`, honouring both arrays' strides.
    static func write(_ new: NDArray, into cache: inout NDArray, at position: Int, name: String) throws {
        let heads = cache.shape[1]
        let depth = cache.shape[3]
        guard new.shape.count == 4, new.shape[1] == heads, new.shape[2] == 1, new.shape[3] == depth else {
            throw HarnessError.model("output \(name) has shape \(new.shape), expected [1, \(heads), 1, \(depth)]")
        }
        switch new.scalarType {
        case .float16: copy(new, as: Float16.self, into: &cache, at: position) { $0 }
        case .float32: copy(new, as: Float.self, into: &cache, at: position) { Float16($0) }
        default: throw HarnessError.model("output \(name) has scalar type \(new.scalarType), expected float16 or float32")
        }
    }

    static func copy<T: BitwiseCopyable>(
        _ new: NDArray, as type: T.Type, into cache: inout NDArray, at position: Int, convert: (T) -> Float16
    ) {
        let target = cache.mutableView(as: Float16.self)
        target.withUnsafeMutablePointer { to, shape, toStrides in
            let (heads, depth) = (shape[1], shape[3])
            let (toHead, toSlot, toIndex) = (toStrides[1], toStrides[2], toStrides[3])
            new.view(as: T.self).withUnsafePointer { from, _, fromStrides in
                let (fromHead, fromIndex) = (fromStrides[1], fromStrides[3])
                for head in 0..<heads {
                    for index in 0..<depth {
                        to[head * toHead + position * toSlot + index * toIndex] = convert(from[head * fromHead + index * fromIndex])
                    }
                }
            }
        }
    }
}
#endif
